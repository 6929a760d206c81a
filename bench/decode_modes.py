"""Rollout time of the hf engine's decode modes (`rollout.decode`: eager, static, compiled) on
one batch, alternating modes so a busy machine slows them alike.

    python bench/decode_modes.py [--model runs/quickstart-sft/final] [--data runs/shapes/train.jsonl]
        [--prompts 16] [--group 8] [--max-new-tokens 48] [--calls 4] [--rounds 2] [--threads 1]

Prints each mode's seconds per `generate` call (the first call of `compiled` includes its compile)
and the generated tokens, which must agree across modes for the same seed. Defaults: the CPU
quickstart's model, data and rollout shape (run `bash scripts/quickstart.sh` first).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="runs/quickstart-sft/final")
    p.add_argument("--data", default="runs/shapes/train.jsonl")
    p.add_argument("--modality", default="vision")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--calls", type=int, default=4, help="generate calls per mode and round")
    p.add_argument("--rounds", type=int, default=2, help="times the modes alternate")
    p.add_argument("--modes", default="eager,compiled", help="comma list of eager, static, compiled")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.data import load_dataset
    from mmrlvr.rollout import SamplingParams
    from mmrlvr.rollout.hf import HFRolloutEngine
    from mmrlvr.train.policy import Policy

    if args.threads:
        torch.set_num_threads(args.threads)
    for path in (args.model, args.data):
        if not Path(path).exists():
            p.error(f"{path} does not exist (run `bash scripts/quickstart.sh` first, or pass it)")
    policy = Policy.load(ModelConfig(path=args.model), modalities.get(args.modality),
                         torch.device(args.device))
    rows = list(load_dataset(args.data))[:args.prompts]
    batch = policy.adapter.encode(rows, policy.processor)
    params = SamplingParams(n=args.group, max_new_tokens=args.max_new_tokens,
                            temperature=args.temperature)
    times: dict[str, list[float]] = {}
    tokens: dict[str, set] = {}
    for rnd in range(args.rounds):
        for mode in args.modes.split(","):
            engine = HFRolloutEngine(policy, decode=mode)
            for call in range(args.calls):
                torch.manual_seed(call)
                t = time.perf_counter()
                out = engine.generate(batch, params)
                times.setdefault(mode, []).append(time.perf_counter() - t)
                tokens.setdefault(mode, set()).add((call, int(out.stats["rollout/tokens"])))
            print(f"round {rnd + 1} {mode:>8}: " + " ".join(f"{t:.2f}" for t in times[mode][-args.calls:])
                  + " s", flush=True)
    print(f"\n{len(rows)} prompts x {args.group} rollouts x <= {args.max_new_tokens} new tokens, "
          f"{args.threads} thread(s), {args.device}")
    base = None
    for mode, ts in times.items():
        warm = ts[1:] if mode == "compiled" else ts           # the first compiled call compiles
        med = statistics.median(warm)
        base = base or med
        print(f"{mode:>8}: median {med:.3f} s per call (x{med / base:.2f} of {next(iter(times))})"
              + (f", first call {ts[0]:.1f} s (compile)" if mode == "compiled" else ""))
    same = len({frozenset(v) for v in tokens.values()}) == 1
    print(f"generated tokens per call agree across modes: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
