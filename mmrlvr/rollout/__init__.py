"""Rollout engines: `hf` (transformers generate, CPU and GPU) and `vllm` (GPU, optional)."""
from mmrlvr.rollout.base import RolloutEngine, SamplingParams


def make_engine(backend: str, policy, branching: dict | None = None,
                vllm_gpu_memory_utilization: float = 0.5, seed: int = 0) -> RolloutEngine:
    """Build the rollout engine named in `rollout.backend` for this policy."""
    if backend == "hf":
        from mmrlvr.rollout.hf import HFRolloutEngine
        return HFRolloutEngine(policy, branching)
    if backend == "vllm":
        from mmrlvr.rollout.vllm import VLLMRolloutEngine  # imports vllm: GPU-only extra
        return VLLMRolloutEngine(policy, branching, vllm_gpu_memory_utilization, seed=seed)
    raise ValueError(f"unknown rollout backend {backend!r}; use 'hf' or 'vllm'")


__all__ = ["RolloutEngine", "SamplingParams", "make_engine"]
