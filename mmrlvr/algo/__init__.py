"""Pure tensor functions of the GRPO family: advantages, surrogate, aggregation, KL."""
from mmrlvr.algo.advantages import group_advantages, zero_spread_fraction
from mmrlvr.algo.loss import aggregate, clipped_surrogate, grpo_loss, kl_estimate

__all__ = ["group_advantages", "zero_spread_fraction", "aggregate", "clipped_surrogate",
           "grpo_loss", "kl_estimate"]
