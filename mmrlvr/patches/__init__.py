"""Layer 1: TransAnyText's HTML patches — the schema and validator (`schema`) and the renderers
(`render`: PIL in process, Chromium for reference). Rewards and adapters both use them."""
