"""One micro-batch's training forward + backward, padded (`Policy.rollout_logprobs`) against
packed (`train.packing`, mmrlvr.train.packing), on tiny Qwen2.5-VL models of several widths.

    python bench/packing.py [--widths 128,512] [--max-len 64,256] [--group 8] [--prompts 2]
        [--reps 3] [--threads 2] [--workdir /tmp/packing-bench]

Each case builds (or reuses) a tiny random-weight Qwen2.5-VL of that hidden size (4 layers,
MLP 2.75x wide) and a micro-batch of `prompts` shapes prompts (56 px images) x `group`
completions whose lengths are drawn uniformly from [max_len/8, max_len] (seeded), then times
forward + backward of the summed logprobs, both paths alternating, median of `reps`. Prints the
padded fraction each path runs (padded: of the completion positions; packed: of the rows'
positions, prompts included), both times and packed/padded; checks that the logprobs agree.
The packs run no completion padding, but attention inside a pack is dense over the whole pack,
so packing pays where the linear layers outweigh attention: wide models, short completions.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _case(model_dir: Path, data: Path, max_len: int, group: int, prompts: int, reps: int):
    import torch

    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.data import load_dataset
    from mmrlvr.train.packing import Layout, packed_logprobs, prompt_lengths
    from mmrlvr.train.policy import Policy

    policy = Policy.load(ModelConfig(path=str(model_dir)), modalities.get("vision"),
                         torch.device("cpu"))
    examples = load_dataset(str(data))[:prompts]
    batch = policy.adapter.encode(examples, policy.processor)
    rows = [u for u in range(prompts) for _ in range(group)]
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(max(max_len // 8, 1), max_len + 1, (len(rows),), generator=gen)
    ids = torch.randint(0, len(policy.tokenizer) - 20, (len(rows), max_len), generator=gen)
    mask = (torch.arange(max_len)[None] < lengths[:, None]).long()
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, policy.pad_id))
    padded_frac = 1 - float(mask.sum()) / mask.numel()
    layout = Layout(rows, lengths.tolist(), prompt_lengths(batch, rows))
    packed_frac = layout.padded_positions() / (layout.rows * layout.width)

    def run(packed: bool):
        policy.model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if packed:
            lp, _ = packed_logprobs(policy, batch, rows, ids, mask)
        else:
            lp, _ = policy.rollout_logprobs(batch, rows, ids, mask)
        (lp * mask).sum().backward()
        return time.perf_counter() - t0, (lp.detach() * mask)

    run(False), run(True)                                      # warm-up
    times = {False: [], True: []}
    for _ in range(reps):
        for packed in (False, True):
            dt, lp = run(packed)
            times[packed].append(dt)
            if packed:
                gap = float((lp - ref).abs().max())
            else:
                ref = lp
    n_params = sum(p.numel() for p in policy.model.parameters())
    return {"params": n_params, "padded_frac": padded_frac, "packed_frac": packed_frac,
            "padded_s": statistics.median(times[False]), "packed_s": statistics.median(times[True]),
            "max_gap": gap}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", default="128,512", help="hidden sizes (comma list)")
    p.add_argument("--max-len", default="64,256", help="longest completion (comma list)")
    p.add_argument("--group", type=int, default=8, help="completions per prompt")
    p.add_argument("--prompts", type=int, default=2, help="prompts in the micro-batch")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per path")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--workdir", default="/tmp/packing-bench",
                   help="where the tiny models and the data go (reused if present)")
    args = p.parse_args(argv)

    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from mmrlvr.tasks.shapes import make_shapes
    from mmrlvr.tiny import build_tiny

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.workdir)
    data = work / "shapes"
    if not (data / "train.jsonl").is_file():
        make_shapes(data, n_train=16, n_test=4, seed=0, image_size=56)
    print(f"micro-batch: {args.prompts} prompts x {args.group} completions, lengths uniform in "
          f"[max/8, max]; torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    head = (f"{'width':>6}{'params':>9}{'max len':>9}{'padded frac':>13}{'packed frac':>13}"
            f"{'padded s':>10}{'packed s':>10}{'packed/padded':>15}{'max |Δ logp|':>14}")
    print(head)
    print("-" * len(head))
    for width in (int(w) for w in args.widths.split(",")):
        model = work / f"tiny-{width}"
        if not (model / "config.json").is_file():
            build_tiny("qwen2.5-vl", model, hidden_size=width, num_heads=max(width // 32, 4),
                       num_kv_heads=max(width // 64, 2), intermediate_size=width * 11 // 4)
        for max_len in (int(n) for n in args.max_len.split(",")):
            r = _case(model, data / "train.jsonl", max_len, args.group, args.prompts, args.reps)
            print(f"{width:>6}{r['params'] / 1e6:>8.1f}M{max_len:>9}{r['padded_frac']:>13.2f}"
                  f"{r['packed_frac']:>13.2f}{r['padded_s']:>10.3f}{r['packed_s']:>10.3f}"
                  f"{r['packed_s'] / r['padded_s']:>15.2f}{r['max_gap']:>14.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
