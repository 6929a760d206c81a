"""CLI flags that are config settings under another name are generated from the config
(`mmrlvr.config.flags`): in every subcommand, a flag named like one of the shared settings is
the generated one, with the field's type, the checks' choices and the field's docstring, so
`mmrlvr eval --device` cannot offer what `train.device` refuses."""
from __future__ import annotations

import argparse

import pytest

from mmrlvr.config.checks import CHOICES
from mmrlvr.config.flags import config_flag, field_type, flag_keys, flag_name
from mmrlvr.config.schema import describe

SHARED = ("model.modality", "model.min_pixels", "model.max_pixels", "rollout.max_new_tokens",
          "rollout.temperature", "rollout.backend", "data.system_prompt", "data.format_prompt",
          "data.on_error", "data.video_fps", "data.max_frames", "train.device", "train.threads")
"""Settings that commands without a config file take as flags."""


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from mmrlvr.cli import build_parser

    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_flag_for_a_shared_setting_is_generated_from_the_config():
    by_flag = {flag_name(key): key for key in SHARED}
    seen = 0
    for name, parser in subcommands().items():
        generated = flag_keys(parser)
        for action in parser._actions:
            flag = next((s for s in action.option_strings if s in by_flag), None)
            if flag is None:
                continue
            key = by_flag[flag]
            if name == "demo" and flag == "--modality":    # the demo's tabs: a subset, on purpose
                continue
            assert generated.get(flag) == key, f"mmrlvr {name} {flag} is declared by hand"
            assert action.type is field_type(key), (name, flag)
            assert list(action.choices or []) == list(CHOICES.get(key, [])), (name, flag)
            seen += 1
    assert seen >= 25                   # eval, stress, check-method, demo, translate


def test_a_generated_flag_says_what_the_setting_is_and_parses_its_type():
    docs = {key: doc for key, _, doc in describe()}
    parser = argparse.ArgumentParser()
    config_flag(parser, "model.min_pixels", default=0, note="0: the model's")
    config_flag(parser, "train.device")
    (pixels, device) = parser._actions[1:]
    assert pixels.help.startswith(docs["model.min_pixels"].rstrip("."))
    assert "(config key model.min_pixels); 0: the model's [0]" in pixels.help
    assert device.default == "auto" and device.choices == ["auto", "cpu", "cuda"]
    args = parser.parse_args(["--min-pixels", "3136", "--device", "cpu"])
    assert args.min_pixels == 3136 and args.device == "cpu"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "gpu"])
    with pytest.raises(TypeError, match="data.templates.*has no flag form"):
        config_flag(argparse.ArgumentParser(), "data.templates")
    with pytest.raises(KeyError, match="no config key 'data.nope'"):
        field_type("data.nope")
