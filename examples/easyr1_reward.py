"""An EasyR1 reward, unchanged: a `compute_score(reward_inputs, **kwargs)` batch function.

EasyR1 calls `compute_score` with one dict per response (`response`, `response_length`,
`ground_truth`) and reads a list of `{"overall": ..., <parts>}` back; its
`reward_function_kwargs` become the spec's other keys. mmrlvr calls it the same way (the
convention is told from the first parameter's name), logs every part, and runs it isolated.
The rows are EasyR1's (`problem` with `<image>`, `images`, `answer`):

    mmrlvr tiny qwen2.5-vl --out runs/tiny-qwen25vl
    python examples/easyr1_reward.py --model runs/tiny-qwen25vl --out runs/easyr1-reward --steps 2
"""
from __future__ import annotations

import argparse
import re
from typing import Any

from PIL import Image

from mmrlvr import GRPOTrainer, load_config


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1
                  ) -> list[dict[str, float]]:
    """EasyR1's math reward, shortened: accuracy of the boxed or tagged answer, plus format."""
    scores = []
    for item in reward_inputs:
        response = item["response"]
        fmt = 1.0 if re.fullmatch(r"\s*<think>.*</think>\s*<answer>.*</answer>\s*", response,
                                  re.S) else 0.0
        found = re.search(r"\\boxed\{([^}]*)\}", response) or \
            re.search(r"<answer>(.*?)</answer>", response, re.S)
        acc = 1.0 if found and found.group(1).strip() == item["ground_truth"].strip() else 0.0
        scores.append({"overall": (1 - format_weight) * acc + format_weight * fmt,
                       "format": fmt, "accuracy": acc})
    return scores


def rows(n: int) -> list[dict[str, Any]]:
    """Geometry3K-shaped rows: the problem text with its image placeholder."""
    out = []
    for i in range(n):
        side = 2 + i % 5
        image = Image.new("RGB", (56, 56), (255, 255, 255))
        image.paste((0, 0, 0), (8, 8, 8 + 6 * side, 8 + 6 * side))
        out.append({"problem": f"<image>The square's side is {side}. Find its perimeter.",
                    "images": [image], "answer": str(4 * side)})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args()

    args = load_config(None, [
        f"train.out_dir={a.out}", f"train.steps={a.steps}", "train.batch_prompts=2",
        "train.micro_batch=16", "train.save_every=0", "rollout.group_size=4",
        "rollout.max_new_tokens=16", "model.min_pixels=3136", "model.max_pixels=3136",
        "train.report_to=[]"])
    trainer = GRPOTrainer(model=a.model, args=args, train_dataset=rows(16),
                          reward_funcs=[{"name": compute_score, "format_weight": 0.2}],
                          overwrite=a.overwrite)
    print("summary:", trainer.train())


if __name__ == "__main__":
    main()
