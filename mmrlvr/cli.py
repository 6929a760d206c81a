"""The `mmrlvr` command: one entry point, a subcommand per job, `--help` on each."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EPILOG_TRAIN = """examples:
  mmrlvr train configs/quickstart.yaml
  mmrlvr train configs/quickstart.yaml train.steps=50 optim.lr=3e-5 rollout.group_size=16
  mmrlvr train --resume runs/quickstart train.steps=400
  mmrlvr train --help-config          # every config key with its default and meaning
  mmrlvr train --print-config configs/quickstart.yaml   # resolved values, and where from
"""


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
                  seed=args.seed, json_out=args.json, plot_out=args.plot, effect=args.power))
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
    from mmrlvr import version_text

    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="GRPO run from a YAML config", epilog=EPILOG_TRAIN,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    t.add_argument("config", nargs="?", help="run config (YAML)")
    t.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=1e-5")
    t.add_argument("--resume", metavar="RUN_DIR",
                   help="continue RUN_DIR from its last complete checkpoint")
    t.add_argument("--overwrite", action="store_true",
                   help="start over in a train.out_dir that holds an earlier run (removes its "
                        "metrics, checkpoints and report)")
    t.add_argument("--force", action="store_true",
                   help="with --resume: continue even though model.path or data differ from the "
                        "run's")
    t.add_argument("--trust-checkpoint", action="store_true",
                   help="with --resume: read a checkpoint written before mmrlvr's safe format (a "
                        "pickled trainer_state.pt, which can run any code planted in it); only "
                        "for a run dir you wrote yourself")
    t.add_argument("--help-config", action="store_true", help="list every config key and exit")
    t.add_argument("--print-config", action="store_true",
                   help="print the resolved config (YAML; values taken from the model say where "
                        "from) and exit, loading no weights")
    t.set_defaults(fn=cmd_train)

    s = sub.add_parser("sft", help="supervised warm start on the same data format")
    s.add_argument("config", help="run config (YAML); the `sft` section sets steps, lr, out_dir")
    s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.steps=100")
    s.add_argument("--pwsd-only", action="store_true",
                   help="skip SFT: run only the PWSD stage (sft.pwsd) from sft.out_dir/final")
    s.add_argument("--overwrite", action="store_true",
                   help="start over in out dirs that hold an earlier run")
    s.set_defaults(fn=cmd_sft)

    e = sub.add_parser("eval", help="accuracy, pass@k, format rate of a model on a dataset")
    e.add_argument("--model", required=True, help="model dir (or hub id) the adapters load")
    e.add_argument("--data", required=True, help="JSONL file (or layout:file.parquet)")
    e.add_argument("--modality", default="vision", help="adapter name [vision]")
    e.add_argument("--limit", type=int, default=0, help="evaluate the first N rows only")
    e.add_argument("--max-new-tokens", type=int, default=0, help="0: the model's generation config's")
    e.add_argument("--samples", type=int, default=0, help="k sampled completions for pass@k")
    e.add_argument("--temperature", type=float, default=1.0, help="for pass@k sampling")
    e.add_argument("--batch-size", type=int, default=32)
    e.add_argument("--min-pixels", type=int, default=0, help="0: the model's image processor's")
    e.add_argument("--max-pixels", type=int, default=0, help="0: the model's image processor's")
    e.add_argument("--system-prompt", default="")
    e.add_argument("--format-prompt", default="")
    e.add_argument("--on-error", default="raise", choices=["raise", "skip"])
    e.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    e.add_argument("--backend", default="auto", choices=["auto", "hf", "vllm"],
                   help="generation engine (auto: vllm on a GPU where it is installed, else hf)")
    e.add_argument("--out", help="write metrics and every prediction to this JSON file")
    e.add_argument("--reward", action="append", metavar="NAME",
                   help="also score the greedy completions with this registered reward and report "
                        "its mean total and parts (e.g. --reward translation for image translation; "
                        "repeatable: the parts are summed with weight 1 each)")
    e.set_defaults(fn=cmd_eval)

    from mmrlvr.tiny import KINDS as TINY_KINDS

    k = sub.add_parser("tiny", help="a tiny random-weight model of a real architecture")
    k.add_argument("kind", choices=list(TINY_KINDS))
    k.add_argument("--out", required=True, help="output model dir")
    k.add_argument("--hidden-size", type=int, default=128)
    k.add_argument("--layers", type=int, default=4)
    k.add_argument("--vocab", type=int, default=600, help="tokenizer size to train")
    k.add_argument("--vision-depth", type=int, default=2,
                   help="vision (audio: encoder) layers")
    k.add_argument("--vision-width", type=int, default=64,
                   help="vision (audio: encoder) width, a multiple of 16")
    k.add_argument("--corpus", nargs="*", help="JSONL datasets whose text the tokenizer learns too")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--audio-window", type=int, default=3,
                   help="qwen2-audio, qwen2.5-omni, qwen3-omni: feature window in seconds (the real "
                        "models' is 30)")
    k.set_defaults(fn=cmd_tiny)

    from mmrlvr.tiny.pretrained import add_parser as add_pretrained
    add_pretrained(sub)

    v = sub.add_parser("pretrain-vision", help="teach a tiny model's vision tower to read "
                       "(meta.vision_labels) before SFT, as a real VLM's arrives pretrained",
                       description="Train the vision tower alone: one linear head per slot of "
                       "meta.vision_labels over its merged tokens, cross-entropy, Adam. The heads "
                       "are dropped; the language model is untouched. Prints held-out accuracy "
                       "per slot before and after.")
    v.add_argument("--model", required=True, help="model dir (e.g. from `mmrlvr tiny`)")
    v.add_argument("--data", required=True, help="training JSONL whose rows carry meta.vision_labels")
    v.add_argument("--eval", help="held-out JSONL for the accuracy figures")
    v.add_argument("--out", required=True, help="output model dir (may equal --model)")
    v.add_argument("--steps", type=int, default=1000)
    v.add_argument("--batch-size", type=int, default=32)
    v.add_argument("--lr", type=float, default=1e-3)
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--min-pixels", type=int, default=56 * 56, help="as model.min_pixels in training")
    v.add_argument("--max-pixels", type=int, default=112 * 112, help="as model.max_pixels in training")
    v.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    v.add_argument("--video-fps", type=float, default=2.0, help="as data.video_fps in training")
    v.add_argument("--max-frames", type=int, default=16, help="as data.max_frames in training")
    v.set_defaults(fn=cmd_pretrain_vision)

    d = sub.add_parser("data", help="synthetic datasets with verifiable answers")
    from mmrlvr.tasks import TASKS

    d.add_argument("task", choices=TASKS.names(),
                   help="shapes, medvqa (vision), tones (audio), banners (image translation), "
                        "motion (video; --image-size 56 for CPU-sized clips)")
    d.add_argument("--out", required=True, help="output dir (train.jsonl, test.jsonl, images/)")
    d.add_argument("--n-train", type=int, default=2000)
    d.add_argument("--n-test", type=int, default=200)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--image-size", type=int, default=112)
    d.add_argument("--families", help="comma-separated task families (banners: language pairs "
                   "such as en-de,en-ru) (default: all)")
    d.add_argument("--ood", action="store_true",
                   help="shapes: also write test_ood.jsonl, a shifted test split (docs/ncgrpo.md)")
    d.add_argument("--compact", action="store_true",
                   help="banners: write patches in the compact <p x= y= ...> form (about half the "
                        "tokens; what the CPU TransAnyText chain trains on)")
    d.add_argument("--rubric-writer", metavar="JSON",
                   help="tones: write each row's rubrics with AudioRubrics' writer and store them, "
                        "e.g. '{\"kind\": \"http\", \"url\": \"http://127.0.0.1:8000/v1\"}' "
                        "(rows it fails on keep the templated rubrics)")
    d.add_argument("--from", dest="from_spec", metavar="LAYOUT:PATH",
                   help="medvqa: convert vqarad:/slake:/pathvqa:PATH, tones: mmau:/avqa:PATH, "
                        "to JSONL instead of synthesising")
    d.set_defaults(fn=cmd_data)

    r = sub.add_parser("stress", help="robustness report: accuracy drops under prompt/image operators")
    r.add_argument("--model", required=True, help="run dir, model dir or hub id the adapters load")
    r.add_argument("--data", required=True, help="JSONL file, or vqarad:/slake:/pathvqa:PATH")
    r.add_argument("--out", required=True, help="report dir (report.md, report.json, stress.png)")
    r.add_argument("--ops", nargs="*", help="operators (default: all); see mmrlvr.stress.ops")
    r.add_argument("--modality", help="adapter name (default: the run's, else vision)")
    r.add_argument("--format-prompt", help="clean format instruction (default: the run's)")
    r.add_argument("--system-prompt", help="system prompt (default: the run's)")
    r.add_argument("--limit", type=int, default=0, help="the first N rows only")
    r.add_argument("--batch-size", type=int, default=32)
    r.add_argument("--max-new-tokens", type=int, default=64)
    r.add_argument("--seed", type=int, default=0, help="seeds operators and the bootstrap")
    r.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    r.add_argument("--dynamic", type=int, default=0, metavar="K",
                   help="also ask each question K times in freshly drawn wordings (held-out "
                   "template, paraphrase, options, format): mean and worst case per question")
    r.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    r.add_argument("--min-pixels", type=int, help="default: the run's, else 56*56")
    r.add_argument("--max-pixels", type=int, help="default: the run's, else 112*112")
    r.set_defaults(fn=cmd_stress)

    c = sub.add_parser("compare", help="paired comparison of runs on the same held-out questions",
                       description="Per eval set: each arm's accuracy, its paired difference to the "
                       "first arm (the baseline) with a 95 % question-level bootstrap interval and "
                       "exact McNemar p; with 2+ seeds per arm, a run-level interval (hierarchical "
                       "bootstrap: runs, then questions), Welch's t test on the per-run means and a "
                       "verdict (effect shown, or no effect at the minimum detectable effect); the "
                       "graded reward's difference where the evals scored one. "
                       "Power helper: `mmrlvr compare --power 5 --sd 3.9` says how many seeds per "
                       "arm a 5-point difference needs at a run-to-run SD of 3.9 points.")
    c.add_argument("runs", nargs="*", metavar="RUN",
                   help="run dirs (their last eval) or `mmrlvr eval --out` files; one arm each")
    c.add_argument("--arm", action="append", metavar="NAME=RUN,RUN,...",
                   help="an arm of several seeds (repeatable); arms follow the RUN arguments")
    c.add_argument("--step", type=int, help="compare the evals at this step (default: each run's last)")
    c.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples [2000]")
    c.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    c.add_argument("--json", help="also write the figures as JSON here")
    c.add_argument("--plot", help="also draw the differences with their intervals (PNG)")
    c.add_argument("--power", type=float, metavar="EFFECT",
                   help="a difference in points to plan for: with runs, each verdict adds how many "
                   "seeds per arm it needs at the row's run-to-run SD (alpha 0.05, power 0.8); "
                   "with --sd and no runs, only that answer")
    c.add_argument("--sd", type=float, metavar="POINTS",
                   help="run-to-run SD of a run's accuracy, in points (a compare's "
                   "run_level.sd_points), for --power without runs")
    c.set_defaults(fn=cmd_compare)

    pl = sub.add_parser("plan", help="per-GPU memory of a config and whether it fits, before "
                        "loading any weights")
    pl.add_argument("config", help="run config (YAML)")
    pl.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.strategy=fsdp2")
    pl.add_argument("--gpus", type=int, help="number of GPUs (default: the visible ones, else 1)")
    pl.add_argument("--gpu-mem", type=float, metavar="GIB",
                    help="memory per GPU in GiB (default: the visible GPU's, else 80)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.set_defaults(fn=cmd_plan)

    g = sub.add_parser("demo", help="Gradio app: ask a trained model, watch a run's curves")
    g.add_argument("--model", help="model dir (or hub id); without it only the monitor works")
    g.add_argument("--run", metavar="RUN_DIR", help="run dir whose metrics.jsonl the monitor plots")
    g.add_argument("--port", type=int, default=7860)
    g.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves other machines too")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--min-pixels", type=int,
                   help="default: the run config's, else the model processor's")
    g.add_argument("--max-pixels", type=int,
                   help="default: the run config's, else the model processor's")
    g.add_argument("--modality", choices=["vision", "audio", "image_translation"],
                   help="adapter to load the model with (default: the run config's, else audio "
                   "for an audio model, else vision)")
    g.add_argument("--compare", metavar="BASE_DIR",
                   help="answer beside the trained model with this one (default: the run's "
                   "starting model, where the run dir records it; `none`: no comparison)")
    g.set_defaults(fn=cmd_demo)

    x = sub.add_parser("translate", help="translate the text in an image: erased background, "
                       "HTML patch, final image (TransAnyText)")
    x.add_argument("--model", required=True, help="model dir trained to write HTML patches")
    x.add_argument("--image", required=True, help="input image")
    x.add_argument("--lang", required=True, help="target language code, e.g. de, fr, es, ru")
    x.add_argument("--out", required=True, help="final image; OUT.erased.png, OUT.patch.png, "
                   "OUT.patch.html and OUT.json are written beside it")
    x.add_argument("--source-lang", help="source language code, named in the prompt when given")
    x.add_argument("--source-patch", help="HTML patch of the source text: erase under its boxes "
                   "(default: under the predicted boxes)")
    x.add_argument("--eraser", default="opencv", choices=["opencv", "diffusers"])
    x.add_argument("--inpaint-model", help="local diffusers inpainting pipeline dir (--eraser diffusers)")
    x.add_argument("--max-new-tokens", type=int, default=512)
    x.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    x.add_argument("--min-pixels", type=int, default=56 * 56)
    x.add_argument("--max-pixels", type=int, default=448 * 448)
    x.set_defaults(fn=cmd_translate)

    from mmrlvr.audit.run import add_parser as add_audit_verifier
    add_audit_verifier(sub)
    from mmrlvr.methods.opd.cli import add_parser as add_opd
    add_opd(sub)
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
