"""Run configuration: YAML onto typed dataclasses, dotted overrides, loud unknown keys.

Every field carries a one-line docstring (shown by `mmrlvr train --help-config`). Defaults are
the values docs/methods.md gives. Unknown keys are errors that name the key and the one meant, TRL's
and EasyR1's names included (`synonyms`). The pixel bounds and completion budget default to the
model's own (`model_defaults`).
"""
from mmrlvr.config.checks import (RANGES, Bound, check_model_path, find_problems,
                                  missing_model_message, validate)
from mmrlvr.config.loading import apply_override, load_config, save_config, to_dict
from mmrlvr.config.model_defaults import (MODEL_DERIVED, ModelDefaults, fill_model_defaults,
                                          model_defaults, render_config, resolve_model_defaults)
from mmrlvr.config.schema import (TRACKERS, AlgoConfig, Config, ConfigError, DataConfig,
                                  LoraConfig, ModelConfig, OptimConfig, PWSDStageConfig,
                                  RolloutConfig, SFTConfig, TrainConfig, describe, eval_sets)
from mmrlvr.config.synonyms import SYNONYMS

__all__ = ["MODEL_DERIVED", "RANGES", "SYNONYMS", "TRACKERS", "AlgoConfig", "Bound", "Config",
           "ConfigError", "DataConfig", "LoraConfig", "ModelConfig", "ModelDefaults",
           "OptimConfig", "PWSDStageConfig", "RolloutConfig", "SFTConfig", "TrainConfig",
           "apply_override", "check_model_path", "describe", "eval_sets", "fill_model_defaults",
           "find_problems", "load_config", "missing_model_message", "model_defaults",
           "render_config", "resolve_model_defaults", "save_config", "to_dict", "validate"]
