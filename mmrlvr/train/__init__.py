"""Layer 3, the training core: the policy and its one forward, the GRPO trainer, SFT, eval,
processes (DDP/FSDP2), checkpoints, run dirs, logging and the memory planner."""
