"""mmrlvr: RL from verifiable rewards (GRPO) for vision- and audio-language models."""
__version__ = "0.1.0"
