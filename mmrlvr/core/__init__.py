"""Layer 1: the types, protocols and small services every other layer builds on (batches,
rollouts, the adapter and reward protocols, the registry, errors, prompt templates)."""
