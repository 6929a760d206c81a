"""GRPO vs multi-template GRPO vs PIRL on synthetic medical VQA: stress-test drops side by side.

Pipeline (CPU by default; everything built locally):
  1. `mmrlvr data medvqa`-style synthetic set (modalities/medvqa.py) under WORKDIR/data
  2. a tiny Qwen2.5-VL whose tokenizer also learned the set's text and every template
  3. one SFT warm start (the `sft` section of configs/medvqa_grpo_cpu.yaml)
  4. from that one model, three RL runs with equal budgets (same steps, prompts, group size,
     lr): configs/medvqa_grpo_cpu.yaml, medvqa_multitemplate_cpu.yaml, medvqa_pirl_cpu.yaml
  5. `mmrlvr stress` on each final model over the test split (held-out templates, paraphrase,
     option shuffle/relabel, format instruction, irrelevant context; image ops; MC -> open)
and prints, per operator, each method's accuracy drop vs clean (points, 95% bootstrap CI), the
group means (text = the robustness figure; image and task-altering apart) and clean accuracy
for closed and open questions. WORKDIR/comparison.json keeps every figure.

    python bench/pirl_compare.py                                    # full budgets (~hours on 2 cores)
    python bench/pirl_compare.py --steps 2 --sft-steps 2 --n-train 32 --n-test 8   # smoke run

What it leaves out: seeds (one run per method; differences of a point or two are noise at these
sizes, so read the CIs), and any GPU model (see configs/vqarad_pirl_qwen25vl7b.yaml).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = {"GRPO": "medvqa_grpo_cpu.yaml", "MT-GRPO": "medvqa_multitemplate_cpu.yaml",
           "PIRL": "medvqa_pirl_cpu.yaml"}


def build_inputs(work: Path, args) -> tuple[Path, Path]:
    """Data and tiny model (reused when present)."""
    from mmrlvr.data import load_jsonl
    from mmrlvr.stress.ops import FORMAT_INSTRUCTIONS, IRRELEVANT_CONTEXT, PARAPHRASES
    from mmrlvr.core.templates import HELDOUT_TEMPLATES, TRAIN_TEMPLATES
    from mmrlvr.tiny import build_tiny
    from mmrlvr.tasks.medvqa import make_medvqa

    data = work / "data"
    if not (data / "info.json").is_file():
        make_medvqa(data, n_train=args.n_train, n_test=args.n_test, seed=args.seed,
                    image_size=args.image_size)
    tiny = work / "tiny"
    if not (tiny / "config.json").is_file():
        corpus = [f"{ex.prompt} <think>{ex.reasoning}</think><answer>{ex.answer}</answer>"
                  for ex in load_jsonl(data / "train.jsonl")]
        corpus += [t.replace("{question}", "") for t in (*TRAIN_TEMPLATES, *HELDOUT_TEMPLATES)] * 5
        corpus += [*FORMAT_INSTRUCTIONS, *IRRELEVANT_CONTEXT, *(p[3] for p in PARAPHRASES)] * 5
        build_tiny("qwen2.5-vl", tiny, extra_corpus=corpus, seed=args.seed)
    return data, tiny


def overrides(work: Path, data: Path, args) -> list[str]:
    return [f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'test.jsonl'}",
            f"data.eval_limit={args.eval_limit}", f"train.seed={args.seed}",
            f"train.threads={args.threads}", f"sft.out_dir={work / 'sft'}"]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", default="runs/pirl-compare")
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-test", type=int, default=300)
    p.add_argument("--image-size", type=int, default=112)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--steps", type=int, default=150, help="RL steps, the same for every method")
    p.add_argument("--eval-limit", type=int, default=0, help="held-out rows for in-run eval (0 = all)")
    p.add_argument("--stress-limit", type=int, default=0, help="test rows stressed (0 = all)")
    p.add_argument("--ops", nargs="*", help="stress operators (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from mmrlvr.config import load_config
    from mmrlvr.train.sft import sft
    from mmrlvr.stress.run import stress
    from mmrlvr.train.trainer import train

    work = Path(args.workdir)
    data, tiny = build_inputs(work, args)
    common = overrides(work, data, args)
    t0 = time.perf_counter()
    if not (work / "sft" / "final" / "config.json").is_file():
        sft(load_config(ROOT / "configs" / METHODS["GRPO"],
                        common + [f"sft.init={tiny}", f"sft.steps={args.sft_steps}"]), progress=True,
            overwrite=True)
    results, timings = {}, {}
    for method, config in METHODS.items():
        run = work / method.lower()
        t = time.perf_counter()
        cfg = load_config(ROOT / "configs" / config, common + [
            f"model.path={work / 'sft' / 'final'}", f"train.steps={args.steps}",
            f"train.out_dir={run}", "train.save_every=0", "train.eval_every=0",
            f"rollout.max_new_tokens={args.max_new_tokens}"])
        train(cfg, progress=True, overwrite=True)
        report = stress(str(run), str(data / "test.jsonl"), str(run / "stress"), args.ops,
                        limit=args.stress_limit, max_new_tokens=args.max_new_tokens, seed=args.seed)
        results[method] = report["summary"]
        timings[method] = time.perf_counter() - t
    print_table(results)
    out = {"settings": vars(args), "seconds": {"total": time.perf_counter() - t0, **timings},
           "results": results}
    (work / "comparison.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"\nfigures: {work / 'comparison.json'}; reports: {work}/<method>/stress/report.md")
    return out


def _cell(m: dict | None) -> str:
    if not m or not m.get("n"):
        return "–"
    lo, hi = m["drop_ci95"]
    return f"{m['drop']:+5.1f} [{lo:+.1f},{hi:+.1f}]"


def print_table(results: dict[str, dict]) -> None:
    methods = list(results)
    first = results[methods[0]]
    width = 24
    print("\naccuracy drop vs clean, points (positive = worse), 95% bootstrap CI, all questions")
    print(f"{'operator':<26}" + "".join(f"{m:>{width}}" for m in methods))
    for name, entry in first["ops"].items():
        label = f"{name} ({entry['kind']})"
        print(f"{label:<26}" + "".join(f"{_cell(results[m]['ops'][name]['all']):>{width}}"
                                       for m in methods))
    print("\nmean drop by operator kind (text = robustness figure), all / closed / open")
    for kind in ("text", "image", "task"):
        cells = []
        for m in methods:
            g = results[m]["groups"][kind]
            cells.append("/".join("–" if g[s] is None else f"{g[s]:+.1f}"
                                  for s in ("all", "closed", "open")))
        print(f"{kind:<26}" + "".join(f"{c:>{width}}" for c in cells))
    print("\nclean accuracy, all / closed / open")
    cells = ["/".join("–" if results[m]["clean"][s]["accuracy"] is None
                      else f"{results[m]['clean'][s]['accuracy']:.3f}" for s in ("all", "closed", "open"))
             for m in methods]
    print(f"{'clean':<26}" + "".join(f"{c:>{width}}" for c in cells))


if __name__ == "__main__":
    main()
