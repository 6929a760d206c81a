"""A TRL GRPO script, ported: the same dataset object and reward functions, mmrlvr's trainer.

TRL's version of this script differs in its import (`from trl import GRPOConfig, GRPOTrainer`)
and in two arguments TRL has no name for: `overrides` (the image size the tiny model sees, in
mmrlvr's keys) and `overwrite` (replace an earlier run in --out). The GRPOConfig keeps TRL's
names; mmrlvr maps them onto its keys (num_generations is rollout.group_size;
per_device_train_batch_size x processes / num_generations is the prompts a step). The dataset
is a `datasets.Dataset` built in memory (images as PIL), the rewards are plain Python functions
in TRL's convention (columns as keyword lists), weighted by TRL's `reward_weights`. Run it on a
tiny model in seconds:

    mmrlvr tiny qwen2.5-vl --out runs/tiny-qwen25vl
    python examples/trl_grpo.py --model runs/tiny-qwen25vl --out runs/trl-port --steps 2
"""
from __future__ import annotations

import argparse
import random
import re

import datasets
from PIL import Image, ImageDraw

from mmrlvr import GRPOConfig, GRPOTrainer


def accuracy_reward(completions, solution, **kwargs):
    """1 where the answer tag holds the gold count, else 0 (TRL's signature; a conversational
    dataset's completions are chat messages, as TRL passes them)."""
    texts = [completion[0]["content"] for completion in completions]
    found = [re.search(r"<answer>(.*?)</answer>", t, re.S) for t in texts]
    return [float(bool(m) and m.group(1).strip() == s) for m, s in zip(found, solution)]


def format_reward(completions, **kwargs):
    """1 for `<think>...</think><answer>...</answer>`, else 0."""
    pattern = re.compile(r"^<think>.*?</think>\s*<answer>.*?</answer>$", re.S)
    return [float(bool(pattern.match(c[0]["content"].strip()))) for c in completions]


def squares(n_rows: int, seed: int) -> datasets.Dataset:
    """Images with 1-4 squares and the question how many, as TRL datasets hold them."""
    rng = random.Random(seed)
    rows = {"prompt": [], "image": [], "solution": []}
    for _ in range(n_rows):
        count = rng.randint(1, 4)
        image = Image.new("RGB", (56, 56), "white")
        draw = ImageDraw.Draw(image)
        for k in range(count):
            x, y = 4 + 13 * k, rng.randint(4, 40)
            draw.rectangle([x, y, x + 9, y + 9], fill=(200, 30, 30))
        rows["prompt"].append([{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "How many squares are there?"}]}])
        rows["image"].append(image)
        rows["solution"].append(str(count))
    return datasets.Dataset.from_dict(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model dir (e.g. from `mmrlvr tiny qwen2.5-vl`)")
    p.add_argument("--out", required=True, help="run dir")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rows", type=int, default=64, help="training rows")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in --out")
    a = p.parse_args()

    train_ds, eval_ds = squares(a.rows, seed=0), squares(4, seed=1)
    args = GRPOConfig(output_dir=a.out, learning_rate=1e-4, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=16, max_steps=a.steps,
                      save_steps=a.steps, per_device_eval_batch_size=4, reward_weights=[1.0, 0.1],
                      report_to="none")
    trainer = GRPOTrainer(model=a.model, reward_funcs=[accuracy_reward, format_reward], args=args,
                          train_dataset=train_ds, eval_dataset=eval_ds,
                          overrides=["model.min_pixels=3136", "model.max_pixels=3136"],
                          overwrite=a.overwrite)
    summary = trainer.train()
    print("summary:", summary)
    print("evaluate:", trainer.evaluate())


if __name__ == "__main__":
    main()
