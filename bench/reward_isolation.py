"""What each way of running a user reward costs: inline, a worker thread (the default for user
rewards) and `isolation: process` (a worker process forked from a zygote, `rewards.process`).

One step's scoring is timed: `--prompts` groups of `--group` completions, each scored by a
native per-completion reward (`fn(example, completion)`, so one call per completion — the case
with the most crossings). Examples carry a `--image`-pixel RGB PIL image, as a vision row's
example does once its media is read, so the copy each call gets (deepcopy on a thread, pickle to
a process) is paid for real. Also timed: the zygote's start (its imports) to the first scored
step, and a restart (a call that runs `os._exit`, then the next one).

    python bench/reward_isolation.py                 # 8 x 8 completions, 224 px images
    python bench/reward_isolation.py --image 0       # text-only examples

Prints one line per mode: ms per step and µs per completion (median of `--repeat` steps).
These are wall-clock figures of this machine (busy or not); read the ratios, not the digits.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from mmrlvr.data import Example  # noqa: E402
from rewards.base import build_combined  # noqa: E402

REWARD = '''
import os

def length(example, completion):
    if completion == "exit":
        os._exit(3)
    return min(len(completion), 40) / 40.0
'''


def step_ms(combined, examples, groups, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        combined.score_groups(examples, groups)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="groups per step")
    parser.add_argument("--group", type=int, default=8, help="completions per group")
    parser.add_argument("--image", type=int, default=224, help="image side in px (0: none)")
    parser.add_argument("--repeat", type=int, default=20, help="steps timed per mode")
    args = parser.parse_args()

    from PIL import Image

    tmp = Path(tempfile.mkdtemp(prefix="bench-reward-"))
    (tmp / "r.py").write_text(REWARD)
    spec = {"name": f"{tmp / 'r.py'}:length", "weight": 1.0}
    images = [Image.new("RGB", (args.image, args.image), (90, 20, 200))] if args.image else []
    examples = [Example(id=f"q{i}", prompt="How many shapes?", answer="3", images=list(images))
                for i in range(args.prompts)]
    groups = [[f"<think>count</think><answer>{j}</answer>" for j in range(args.group)]
              for _ in examples]
    n = args.prompts * args.group

    import rewards
    inline = rewards.get(spec["name"])
    modes = {"inline (no isolation)": inline, "thread (default)": build_combined([spec])}
    start = time.perf_counter()
    process = build_combined([{**spec, "isolation": "process"}])
    process.score_groups(examples[:1], [groups[0][:1]])
    started = time.perf_counter() - start
    modes["process"] = process

    print(f"{args.prompts} x {args.group} completions per step, "
          f"{f'{args.image} px image' if args.image else 'no image'} per example, "
          f"median of {args.repeat} steps")
    base = None
    for name, reward in modes.items():
        for _ in range(2):                                   # warm: caches, the worker's pages
            reward.score_groups(examples, groups)
        ms = step_ms(reward, examples, groups, args.repeat)
        base = base or ms
        print(f"  {name:<24} {ms:8.2f} ms/step  {ms * 1e3 / n:8.1f} µs/completion  "
              f"x{ms / base:.1f}")
    worker = process.parts[0][2].worker
    restarts = []
    for _ in range(5):
        process.score(examples[0], ["exit"])               # the worker dies: a counted error
        start = time.perf_counter()
        process.score(examples[0], ["ok"])                 # a new worker forked and used
        restarts.append(time.perf_counter() - start)
    print(f"  process start (zygote imports, fork, first call): {started:.2f} s")
    print(f"  restart after os._exit (fork + build + one call): "
          f"{statistics.median(restarts) * 1e3:.1f} ms (median of 5; {worker.starts} workers)")
    worker.close()


if __name__ == "__main__":
    main()
