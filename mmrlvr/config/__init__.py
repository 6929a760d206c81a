"""Run configuration: YAML onto typed dataclasses, dotted overrides, loud unknown keys.

Every field carries a one-line docstring (shown by `mmrlvr train --help-config`). Defaults are
the values METHODS.md gives. Unknown keys are errors that name the key and the nearest known one.
"""
from mmrlvr.config.checks import (RANGES, Bound, check_model_path, find_problems,
                                  missing_model_message, validate)
from mmrlvr.config.loading import apply_override, load_config, save_config, to_dict
from mmrlvr.config.schema import (AlgoConfig, Config, ConfigError, DataConfig, LoraConfig,
                                  ModelConfig, OptimConfig, PWSDStageConfig, RolloutConfig,
                                  SFTConfig, TrainConfig, describe)

__all__ = ["RANGES", "AlgoConfig", "Bound", "Config", "ConfigError", "DataConfig", "LoraConfig",
           "ModelConfig", "OptimConfig", "PWSDStageConfig", "RolloutConfig", "SFTConfig",
           "TrainConfig", "apply_override", "check_model_path", "describe", "find_problems",
           "load_config", "missing_model_message", "save_config", "to_dict", "validate"]
