"""The arguments of each `mmrlvr` subcommand, one function each (mmrlvr/cli.py's `build_parser`
adds them and passes the function that runs the command)."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from mmrlvr.config.flags import config_flag

EPILOG_TRAIN = """examples:
  mmrlvr train configs/quickstart.yaml
  mmrlvr train configs/quickstart.yaml train.steps=50 optim.lr=3e-5 rollout.group_size=16
  mmrlvr train --resume runs/quickstart train.steps=400
  mmrlvr train --help-config          # every config key with its default and meaning
  mmrlvr train --print-config configs/quickstart.yaml   # resolved values, and where from
"""


def add_train(sub: Any, fn: Callable) -> None:
    """`mmrlvr train`: its arguments; `fn` runs it."""
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
    t.set_defaults(fn=fn)


def add_sft(sub: Any, fn: Callable) -> None:
    """`mmrlvr sft`: its arguments; `fn` runs it."""
    s = sub.add_parser("sft", help="supervised warm start on the same data format")
    s.add_argument("config", help="run config (YAML); the `sft` section sets steps, lr, out_dir")
    s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.steps=100")
    s.add_argument("--pwsd-only", action="store_true",
                   help="skip SFT: run only the PWSD stage (sft.pwsd) from sft.out_dir/final")
    s.add_argument("--overwrite", action="store_true",
                   help="start over in out dirs that hold an earlier run")
    s.set_defaults(fn=fn)


def add_eval(sub: Any, fn: Callable) -> None:
    """`mmrlvr eval`: its arguments; `fn` runs it."""
    e = sub.add_parser("eval", help="accuracy, pass@k, format rate of a model on a dataset")
    e.add_argument("--model", required=True, help="model dir (or hub id) the adapters load")
    e.add_argument("--data", required=True, help="JSONL file (or layout:file.parquet)")
    config_flag(e, "model.modality")
    e.add_argument("--limit", type=int, default=0, help="evaluate the first N rows only")
    config_flag(e, "rollout.max_new_tokens", default=0, note="0: the model's generation config's")
    e.add_argument("--samples", type=int, default=0, help="k sampled completions for pass@k")
    config_flag(e, "rollout.temperature", note="for pass@k sampling")
    e.add_argument("--batch-size", type=int, default=32)
    config_flag(e, "model.min_pixels", default=0, note="0: the model's image processor's")
    config_flag(e, "model.max_pixels", default=0, note="0: the model's image processor's")
    config_flag(e, "data.system_prompt")
    config_flag(e, "data.format_prompt")
    config_flag(e, "data.on_error")
    config_flag(e, "train.device")
    config_flag(e, "rollout.backend")
    e.add_argument("--out", help="write metrics and every prediction to this JSON file")
    e.add_argument("--reward", action="append", metavar="NAME",
                   help="also score the greedy completions with this registered reward and report "
                        "its mean total and parts (e.g. --reward translation for image translation; "
                        "repeatable: the parts are summed with weight 1 each)")
    e.set_defaults(fn=fn)


def add_tiny(sub: Any, fn: Callable) -> None:
    """`mmrlvr tiny`: its arguments; `fn` runs it."""
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
    k.set_defaults(fn=fn)


def add_pretrain_vision(sub: Any, fn: Callable) -> None:
    """`mmrlvr pretrain-vision`: its arguments; `fn` runs it."""
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
    config_flag(v, "model.min_pixels", default=56 * 56)
    config_flag(v, "model.max_pixels", default=112 * 112)
    config_flag(v, "train.threads")
    config_flag(v, "data.video_fps")
    config_flag(v, "data.max_frames")
    v.set_defaults(fn=fn)


def add_data(sub: Any, fn: Callable) -> None:
    """`mmrlvr data`: its arguments; `fn` runs it."""
    d = sub.add_parser("data", help="synthetic datasets with verifiable answers")
    from mmrlvr.tasks import TASKS

    d.add_argument("task", choices=TASKS.names(),
                   help="shapes, medvqa (vision), tones (audio), banners (image translation), "
                        "motion (video; --image-size 56 for CPU-sized clips), zoom (vision, "
                        "multi-turn tools; --image-size is the prompt's side, 56 on CPU), clip (audio, "
                        "multi-turn tools: a 12 s recording, a question about a segment past "
                        "the model's window), arith (text: a + b, two-step expressions, countdown)")
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
    d.set_defaults(fn=fn)


def add_stress(sub: Any, fn: Callable) -> None:
    """`mmrlvr stress`: its arguments; `fn` runs it."""
    r = sub.add_parser("stress", help="robustness report: accuracy drops under prompt/image operators")
    r.add_argument("--model", required=True, help="run dir, model dir or hub id the adapters load")
    r.add_argument("--data", required=True, help="JSONL file, or vqarad:/slake:/pathvqa:PATH")
    r.add_argument("--out", required=True, help="report dir (report.md, report.json, stress.png)")
    r.add_argument("--ops", nargs="*", help="operators (default: all); see mmrlvr.stress.ops")
    config_flag(r, "model.modality", default=None, note="default: the run's, else vision")
    config_flag(r, "data.format_prompt", default=None,
                note="the clean one the operators perturb; default: the run's")
    config_flag(r, "data.system_prompt", default=None, note="default: the run's")
    r.add_argument("--limit", type=int, default=0, help="the first N rows only")
    r.add_argument("--batch-size", type=int, default=32)
    config_flag(r, "rollout.max_new_tokens", default=64)
    r.add_argument("--seed", type=int, default=0, help="seeds operators and the bootstrap")
    r.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    r.add_argument("--dynamic", type=int, default=0, metavar="K",
                   help="also ask each question K times in freshly drawn wordings (held-out "
                   "template, paraphrase, options, format): mean and worst case per question")
    config_flag(r, "train.device")
    config_flag(r, "model.min_pixels", default=None, note="default: the run's, else 56*56")
    config_flag(r, "model.max_pixels", default=None, note="default: the run's, else 112*112")
    r.set_defaults(fn=fn)


def add_compare(sub: Any, fn: Callable) -> None:
    """`mmrlvr compare`: its arguments; `fn` runs it."""
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
    c.add_argument("--mechanism", action="append", metavar="ARM=CHECK.json",
                   help="the arm's mechanism check (`mmrlvr check-method --json`): shown beside "
                   "its verdict; an inactive mechanism is reported as such, not compared "
                   "(repeatable)")
    c.add_argument("--sd", type=float, metavar="POINTS",
                   help="run-to-run SD of a run's accuracy, in points (a compare's "
                   "run_level.sd_points), for --power without runs")
    c.set_defaults(fn=fn)


def add_plan(sub: Any, fn: Callable) -> None:
    """`mmrlvr plan`: its arguments; `fn` runs it."""
    pl = sub.add_parser("plan", help="per-GPU memory of a config and whether it fits, before "
                        "loading any weights")
    pl.add_argument("config", help="run config (YAML)")
    pl.add_argument("overrides", nargs="*", help="dotted overrides, e.g. train.strategy=fsdp2")
    pl.add_argument("--gpus", type=int, help="number of GPUs (default: the visible ones, else 1)")
    pl.add_argument("--gpu-mem", type=float, metavar="GIB",
                    help="memory per GPU in GiB (default: the visible GPU's, else 80)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    pl.set_defaults(fn=fn)


def add_demo(sub: Any, fn: Callable) -> None:
    """`mmrlvr demo`: its arguments; `fn` runs it."""
    g = sub.add_parser("demo", help="Gradio app: ask a trained model, watch a run's curves")
    g.add_argument("--model", help="model dir (or hub id); without it only the monitor works")
    g.add_argument("--run", metavar="RUN_DIR", help="run dir whose metrics.jsonl the monitor plots")
    g.add_argument("--port", type=int, default=7860)
    g.add_argument("--host", default="127.0.0.1", help="0.0.0.0 serves other machines too")
    config_flag(g, "train.device")
    config_flag(g, "model.min_pixels", default=None,
                note="default: the run config's, else the model processor's")
    config_flag(g, "model.max_pixels", default=None,
                note="default: the run config's, else the model processor's")
    g.add_argument("--modality", choices=["vision", "audio", "image_translation"],
                   help="adapter to load the model with (default: the run config's, else audio "
                   "for an audio model, else vision)")
    g.add_argument("--compare", metavar="BASE_DIR",
                   help="answer beside the trained model with this one (default: the run's "
                   "starting model, where the run dir records it; `none`: no comparison)")
    g.set_defaults(fn=fn)


def add_translate(sub: Any, fn: Callable) -> None:
    """`mmrlvr translate`: its arguments; `fn` runs it."""
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
    x.add_argument("--eraser", default="auto", choices=["auto", "opencv", "diffusers"],
                   help="auto: diffusers on a CUDA machine given --inpaint-model, else OpenCV")
    x.add_argument("--inpaint-model", help="local diffusers inpainting pipeline dir (the diffusion stage)")
    x.add_argument("--refine", default="auto", choices=["auto", "on", "off"],
                   help="diffusion refinement of the drawn text (auto: with the diffusers eraser)")
    x.add_argument("--inpaint-steps", type=int, default=20, help="denoising steps of the diffusion stage")
    x.add_argument("--refine-strength", type=float, default=0.3,
                   help="how far refinement re-noises the drawn text, in (0, 1]")
    config_flag(x, "rollout.max_new_tokens", default=512)
    config_flag(x, "train.device")
    config_flag(x, "model.min_pixels", default=56 * 56)
    config_flag(x, "model.max_pixels", default=448 * 448)
    x.set_defaults(fn=fn)
