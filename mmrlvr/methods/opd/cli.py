"""`mmrlvr opd CONFIG`: on-policy distillation, then GRPO from the checkpoint the held-out score
picks (stage.py; docs/opd.md)."""
from __future__ import annotations

import argparse
import json

EPILOG = """examples:
  mmrlvr opd configs/shapes_opd_cpu.yaml
  mmrlvr opd configs/shapes_opd_cpu.yaml opd.teacher=runs/quickstart-sft-long/final opd.patience=3
  mmrlvr opd configs/shapes_opd_cpu.yaml --opd-only      # the OPD stage and its switch only
continue the GRPO stage after a stop with `mmrlvr train --resume TRAIN_OUT_DIR`
"""


def cmd_opd(args: argparse.Namespace) -> int:
    from mmrlvr.config import load_config
    from mmrlvr.methods.opd.stage import opd_then_grpo

    cfg = load_config(args.config, args.overrides)
    out = opd_then_grpo(cfg, overwrite=args.overwrite, opd_only=args.opd_only)
    if out:                                  # rank 0
        print(json.dumps(out, indent=2))
    return 0


def add_parser(sub) -> None:
    o = sub.add_parser("opd", help="on-policy distillation from a teacher, then GRPO from the "
                       "checkpoint the held-out score picks", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Stage 1: the student samples and the teacher's per-token "
                       "reverse KL on its tokens is the loss (opd.*), with a held-out eval every "
                       "opd.eval_every steps; it ends when the score reaches opd.threshold or has "
                       "not improved for opd.patience evals. Stage 2: GRPO as the config says "
                       "(train.*) from the best OPD checkpoint.")
    o.add_argument("config", help="run config (YAML) with an `opd` section (opd.teacher at least)")
    o.add_argument("overrides", nargs="*", help="dotted overrides, e.g. opd.eval_every=20")
    o.add_argument("--opd-only", action="store_true",
                   help="run the OPD stage only and print where GRPO would start")
    o.add_argument("--overwrite", action="store_true",
                   help="start over in opd.out_dir and train.out_dir if they hold earlier runs")
    o.set_defaults(fn=cmd_opd)
