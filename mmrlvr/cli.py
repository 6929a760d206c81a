"""The `mmrlvr` command: one entry point, a subcommand per job, `--help` on each."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _config_help() -> str:
    from mmrlvr.config import describe

    rows = describe()
    width = max(len(k) for k, _, _ in rows)
    return "\n".join(f"  {k:<{width}}  {doc}  [default: {d}]" for k, d, doc in rows)


def cmd_train(args: argparse.Namespace) -> int:
    from mmrlvr.config import fill_model_defaults, load_config, render_config

    if args.help_config:
        print(_config_help())
        return 0
    if args.resume:
        run_dir = Path(args.resume)
        overrides = ([args.config] if args.config else []) + args.overrides
        cfg = load_config(run_dir / "config.yaml", overrides + [f"train.out_dir={run_dir}"])
    else:
        if not args.config:
            print("mmrlvr train: give a CONFIG.yaml (or --resume RUN_DIR)", file=sys.stderr)
            return 2
        cfg = load_config(args.config, args.overrides)
    if args.print_config:               # json files only: no weights load
        print(render_config(*fill_model_defaults(cfg)), end="")
        return 0
    from mmrlvr.train.trainer import train

    summary = train(cfg, resume=bool(args.resume), overwrite=args.overwrite, force=args.force,
                    trust_checkpoint=args.trust_checkpoint)
    if summary:
        print(json.dumps(summary, indent=2))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from mmrlvr.config import load_config
    from mmrlvr.train.sft import sft

    cfg = load_config(args.config, args.overrides)
    if args.pwsd_only:
        from pathlib import Path

        from mmrlvr.train.sft import run_pwsd
        init = Path(cfg.sft.out_dir) / "final"
        if not (init / "config.json").is_file():
            print(f"--pwsd-only starts from the SFT model {init}, which does not exist; run "
                  "`mmrlvr sft` first or set sft.out_dir", file=sys.stderr)
            return 2
        summary = run_pwsd(cfg, init, overwrite=args.overwrite)
    else:
        summary = sft(cfg, overwrite=args.overwrite)
    if summary:                      # rank 0 of a multi-process run
        print(json.dumps(summary, indent=2))
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from mmrlvr.train.evaluate import cmd_eval as run_eval

    return run_eval(args)


def cmd_pretrain_vision(args: argparse.Namespace) -> int:
    from mmrlvr.tiny.vision_pretrain import pretrain_vision

    summary = pretrain_vision(args.model, args.data, args.out, eval_data=args.eval,
                              steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                              seed=args.seed, min_pixels=args.min_pixels,
                              max_pixels=args.max_pixels, threads=args.threads,
                              video_fps=args.video_fps, max_frames=args.max_frames)
    print(json.dumps(summary, indent=2))
    print(f"model with the pretrained vision tower written to {args.out}")
    return 0


def cmd_tiny(args: argparse.Namespace) -> int:
    from mmrlvr.tiny import build_tiny

    extra = []
    for path in args.corpus or []:
        from mmrlvr.data import load_jsonl
        for ex in load_jsonl(path):
            extra.append(f"{ex.prompt} <think>{ex.reasoning or ''}</think><answer>{ex.answer}</answer>")
            extra += [t["text"] for t in (ex.meta or {}).get("trajectory", [])]   # zoom: tool calls
    out = build_tiny(args.kind, args.out, hidden_size=args.hidden_size, num_layers=args.layers,
                     vocab_target=args.vocab, extra_corpus=extra or None, seed=args.seed,
                     audio_window=args.audio_window, vision_depth=args.vision_depth,
                     vision_width=args.vision_width)
    print(f"tiny {args.kind} model written to {out}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from mmrlvr.tasks import TASKS, TaskOptions

    task = TASKS.get(args.task)
    if args.from_spec:
        if task.convert is None:
            print(f"mmrlvr data {args.task}: error: --from converts public releases, and "
                  f"{args.task} has none (tasks with one: medvqa, tones)", file=sys.stderr)
            return 2
        info = task.convert(args.from_spec, Path(args.out))
    else:
        info = task.make(Path(args.out), TaskOptions(
            n_train=args.n_train, n_test=args.n_test, seed=args.seed, image_size=args.image_size,
            families=args.families.split(",") if args.families else None, compact=args.compact,
            ood=args.ood))
    if args.rubric_writer:
        info["rubrics"] = _write_rubrics(Path(args.out), json.loads(args.rubric_writer))
    print(json.dumps(info, indent=2))
    return 0


def _write_rubrics(out: Path, spec: dict) -> dict:
    """AudioRubrics' writer over every JSONL the task wrote: rubrics stored with each row."""
    from mmrlvr.data import load_jsonl, write_jsonl
    from mmrlvr.methods.audio_rubrics.writer import RubricBook, write_rubrics

    book = RubricBook.from_spec(spec)          # shared: one cache across the files
    counts = {}
    for path in sorted(out.glob("*.jsonl")):
        examples = load_jsonl(path)
        counts[path.name] = write_rubrics(examples, book)
        write_jsonl(examples, path)
    return counts


def cmd_translate(args: argparse.Namespace) -> int:
    from mmrlvr.translate import cmd_translate as run_translate

    return run_translate(args)


def cmd_stress(args: argparse.Namespace) -> int:
    from mmrlvr.stress.run import stress

    report = stress(args.model, args.data, args.out, args.ops, modality=args.modality,
                    format_prompt=args.format_prompt, system_prompt=args.system_prompt,
                    limit=args.limit, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                    seed=args.seed, n_boot=args.bootstrap, device=args.device,
                    min_pixels=args.min_pixels, max_pixels=args.max_pixels, dynamic=args.dynamic)
    groups = report["summary"]["groups"]
    shown = {"clean": report["summary"]["clean"], "mean_drop": groups}
    if args.dynamic:
        shown["dynamic"] = report["dynamic"]["overall"]
    print(json.dumps(shown, indent=2))
    print(f"wrote {Path(args.out) / 'report.md'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from mmrlvr.compare import CompareError, power_report, run

    try:
        if args.sd is not None:
            if args.power is None or args.runs or args.arm:
                raise CompareError("--sd is the power helper's: give it with --power EFFECT and "
                                   "no runs (with runs, each row's SD comes from its runs)")
            print(power_report(args.power, args.sd))
            return 0
        if args.power is not None and not (args.runs or args.arm):
            raise CompareError("--power without runs needs --sd POINTS (the run-to-run SD)")
        print(run(args.runs, args.arm or [], step=args.step, n_boot=args.bootstrap,
                  seed=args.seed, json_out=args.json, plot_out=args.plot, effect=args.power,
                  mechanisms=args.mechanism or []))
    except CompareError as err:
        print(f"mmrlvr compare: error: {err}", file=sys.stderr)
        return 2
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from mmrlvr.train.plan import cmd_plan as run_plan

    return run_plan(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from apps.launcher import serve

    return serve(model=args.model, run=args.run, host=args.host, port=args.port,
                 device=args.device, min_pixels=args.min_pixels, max_pixels=args.max_pixels,
                 modality=args.modality, compare=args.compare)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mmrlvr", description="GRPO-style RL from verifiable rewards "
                                "for vision- and audio-language models (GPU or laptop CPU).")
    from mmrlvr import cli_args, version_text

    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)

    cli_args.add_train(sub, cmd_train)
    cli_args.add_sft(sub, cmd_sft)
    cli_args.add_eval(sub, cmd_eval)
    cli_args.add_tiny(sub, cmd_tiny)
    from mmrlvr.tiny.pretrained import add_parser as add_pretrained
    add_pretrained(sub)
    cli_args.add_pretrain_vision(sub, cmd_pretrain_vision)
    cli_args.add_data(sub, cmd_data)
    cli_args.add_stress(sub, cmd_stress)
    cli_args.add_compare(sub, cmd_compare)
    cli_args.add_plan(sub, cmd_plan)
    cli_args.add_demo(sub, cmd_demo)
    cli_args.add_translate(sub, cmd_translate)
    from mmrlvr.audit.run import add_parser as add_audit_verifier
    add_audit_verifier(sub)
    from mmrlvr.methods.opd.cli import add_parser as add_opd
    add_opd(sub)
    from mmrlvr.cli_check import add_parser as add_check_method
    add_check_method(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # overrides may follow a flag (`mmrlvr sft C.yaml --pwsd-only sft.steps=5`)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # per-shard load/save bars drown the run's own progress
    from mmrlvr.train.checkpoint import CheckpointError
    from mmrlvr.config import ConfigError
    from mmrlvr.data import DataError
    from mmrlvr.train.parallel import LaunchError
    from mmrlvr.train.policy import PolicyError
    from mmrlvr.train.rundir import RunDirError
    from mmrlvr.core.errors import TrainingError
    from rewards.base import RewardError

    try:
        return args.fn(args)
    except (ConfigError, DataError, PolicyError, LaunchError, FileNotFoundError, RunDirError,
            TrainingError, CheckpointError, RewardError) as err:
        print(f"mmrlvr {args.command}: error: {err}", file=sys.stderr)
        return 2
    finally:
        dist = sys.modules.get("torch.distributed")     # only where a run imported it
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
