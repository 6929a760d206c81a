"""`mmrlvr check-method NAME --model DIR --data FILE`: is a method's mechanism active on this
starting model and data (`mmrlvr.core.method_check`; docs/harness.md, "Mechanism checks")?

The check is found by name in `METHOD_CHECKS` (each method folder registers its own); it prints
the verdict, why, and its figures, and with `--json FILE` writes them with the inputs. The exit
status is 0 for either verdict (a script reads `verdict` from the JSON), 2 for an error.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from mmrlvr.config.flags import config_flag

EPILOG = """examples:
  mmrlvr check-method ncgrpo --model runs/quickstart-sft/final --data runs/shapes/train.jsonl
  mmrlvr check-method ncgrpo --model M --data D --option alpha=0.3 --json runs/checks/ncgrpo.json
  mmrlvr check-method structreward --data runs/shapes/train.jsonl      # data only: no model
  mmrlvr check-method om_grpo --model M --data D --rows 64 --group 8
  mmrlvr check-method ncgrpo --config configs/shapes_ncgrpo_cpu.yaml   # the run's model, data, noise
"""


def parse_options(pairs: list[str]) -> dict:
    """`key=value` pairs, each value read as a YAML scalar (`alpha=0.3` -> 0.3)."""
    import yaml

    from mmrlvr.config import ConfigError

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option {pair!r}: write it as key=value, e.g. alpha=0.3")
        out[key] = yaml.safe_load(value)
    return out


def resolve(args: argparse.Namespace):
    """(run config or None, ModelConfig or None, DataConfig, CheckOptions): the flags, else the
    `--config` file's values, else the defaults."""
    from dataclasses import replace

    from mmrlvr.config import ConfigError, DataConfig, ModelConfig, load_config
    from mmrlvr.core.method_check import CheckOptions

    if args.set and not args.config:
        raise ConfigError("check-method: --set overrides a --config's keys; give the --config")
    cfg = load_config(args.config, args.set or []) if args.config else None

    def pick(flag, from_cfg, default):
        return flag if flag is not None else from_cfg if cfg is not None else default

    model = cfg.model if cfg is not None else ModelConfig()
    model = replace(model, path=args.model) if args.model else model
    data = args.data or (cfg.data.train if cfg is not None else None)
    if not data:
        raise ConfigError("check-method: give the rows with --data FILE (or a --config whose "
                          "data.train names them)")
    options = CheckOptions(
        rows=args.rows,
        group=pick(args.group, cfg and cfg.rollout.group_size, 8),
        max_new_tokens=pick(args.max_new_tokens, cfg and cfg.rollout.max_new_tokens, 64),
        temperature=pick(args.temperature, cfg and cfg.rollout.temperature, 1.0),
        system_prompt=pick(args.system_prompt, cfg and cfg.data.system_prompt, ""),
        format_prompt=pick(args.format_prompt, cfg and cfg.data.format_prompt, ""),
        seed=args.seed, method=parse_options(args.option or []))
    data_cfg = replace(cfg.data, train=data) if cfg is not None else DataConfig(train=data)
    return cfg, (model if model.path else None), data_cfg, options


def cmd_check_method(args: argparse.Namespace) -> int:
    import torch

    from mmrlvr.core.method_check import CheckContext
    from mmrlvr.core.registry import METHOD_CHECKS
    from mmrlvr.data import load_split

    check = METHOD_CHECKS.get(args.name)            # unknown: "did you mean", before any load
    cfg, model, data, options = resolve(args)
    modality = args.modality or (cfg.model.modality if cfg is not None else "vision")
    examples = load_split(data, "train")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")

    def load_policy():
        import modalities
        from mmrlvr.train.policy import Policy

        torch.manual_seed(args.seed)
        return Policy.load(model, modalities.get(modality), torch.device(device))

    result = check(CheckContext(examples, options, load_policy if model else None, cfg))
    print(f"{result.method}: {result.verdict} ({result.why})")
    width = max((len(k) for k in result.figures), default=0)
    for key, value in result.figures.items():
        print(f"  {key:<{width}}  {value:g}")
    if args.json:
        out = {**result.to_dict(), "inputs": {"model": model.path if model else None,
                                             "data": data.train, "config": args.config,
                                             "modality": modality, **asdict(options)}}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("check-method", help="is a method's mechanism active on this starting "
                       "model and data (before any comparison)", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Measure what a method changes (NC-GRPO: noisy-vs-clean KL and "
                       "changed answers; StructReward: reference-step self-agreement; OM-GRPO: "
                       "majority-vote accuracy; PIRL: answers changed by a template swap; GMTS: "
                       "kept-token fraction and lift; Cliff: located cliffs and where; "
                       "AudioRubrics: criteria that split a group) and say active or inactive, "
                       "and why.")
    c.add_argument("name", help="method name (an unknown one lists the known checks)")
    c.add_argument("--config", metavar="CONFIG.yaml",
                   help="take the model (path, modality, pixels), data.train, prompts, rollout "
                        "group size, temperature, max tokens and rollout.branching from this run "
                        "config; the flags below override it")
    c.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a --config override, as `mmrlvr train` takes them (repeatable), e.g. "
                        "rollout.branching.alpha=0.3")
    c.add_argument("--model", help="starting model dir (checks that sample need it)")
    c.add_argument("--data", help="JSONL file (or layout:file.parquet) of the rows")
    config_flag(c, "model.modality", default=None, note="default: the --config's, else vision")
    c.add_argument("--rows", type=int, default=0, help="read the first N rows (0: the check's default)")
    c.add_argument("--group", type=int, help="completions per question [8]")
    config_flag(c, "rollout.max_new_tokens", default=None, note="default: the --config's, else 64")
    config_flag(c, "rollout.temperature", default=None, note="default: the --config's, else 1.0")
    config_flag(c, "data.system_prompt", default=None, note='default: the --config\'s, else ""')
    config_flag(c, "data.format_prompt", default=None, note='default: the --config\'s, else ""')
    c.add_argument("--seed", type=int, default=0)
    config_flag(c, "train.device")
    c.add_argument("--option", action="append", metavar="KEY=VALUE",
                   help="the method's own setting, e.g. alpha=0.3 for ncgrpo (repeatable)")
    c.add_argument("--json", metavar="FILE", help="write the verdict, figures and inputs here")
    c.set_defaults(fn=cmd_check_method)
