"""Rollout engines: `hf` (transformers generate, CPU and GPU) and `vllm` (GPU, optional)."""
from mmrlvr.rollout.base import RolloutEngine, SamplingParams


def resolve_backend(name: str) -> str:
    """`auto`: vLLM where it can run (a CUDA device and the `vllm` package), else transformers."""
    if name != "auto":
        return name
    import importlib.util

    import torch

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"


def make_engine(backend: str, policy, branching: dict | None = None,
                vllm_gpu_memory_utilization: float = 0.5, seed: int = 0,
                decode: str = "eager") -> RolloutEngine:
    """Build the rollout engine named in `rollout.backend` for this policy (`decode`: how the
    hf engine runs its decode steps; vLLM has its own)."""
    backend = resolve_backend(backend)
    if backend == "hf":
        from mmrlvr.rollout.hf import HFRolloutEngine
        return HFRolloutEngine(policy, branching, decode)
    if backend == "vllm":
        from mmrlvr.rollout.vllm import VLLMRolloutEngine  # imports vllm: GPU-only extra
        return VLLMRolloutEngine(policy, branching, vllm_gpu_memory_utilization, seed=seed)
    raise ValueError(f"unknown rollout backend {backend!r}; use 'hf' or 'vllm'")


__all__ = ["RolloutEngine", "SamplingParams", "make_engine", "resolve_backend"]
