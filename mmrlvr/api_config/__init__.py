"""TRL's configs on mmrlvr: `GRPOConfig` (`grpo`) for GRPOTrainer and `SFTConfig` (`sft`) for
the warm start take a TRL script's names with TRL's meanings and become mmrlvr config keys,
checked as the CLI checks a config file; what they share is `trl.TRLConfig`. `peft` reads a
trainer's `peft_config=` (a peft.LoraConfig) into `model.lora`; `launch` refuses an accelerate
launch that started one process for several. docs/api.md lists every name, what it sets, and
what to use for those mmrlvr refuses.
"""
from mmrlvr.api_config.grpo import GRPOConfig
from mmrlvr.api_config.peft import lora_overrides
from mmrlvr.api_config.sft import SFTConfig
from mmrlvr.api_config.trl import TRLConfig

__all__ = ["GRPOConfig", "SFTConfig", "TRLConfig", "lora_overrides"]
