"""A TRL GRPO script, ported: the same dataset object and reward functions, mmrlvr's trainer.

TRL's version of this script reads

    from trl import GRPOConfig, GRPOTrainer
    args = GRPOConfig(output_dir=OUT, learning_rate=1e-5, num_generations=8, max_steps=STEPS, ...)
    trainer = GRPOTrainer(model=MODEL, reward_funcs=[accuracy_reward, format_reward], args=args,
                          train_dataset=train_ds)
    trainer.train()

Here only the import and the config change: `load_config` takes mmrlvr's keys (the TRL names in
a config are answered with ours: num_generations is rollout.group_size). The dataset is a
`datasets.Dataset` built in memory (images as PIL), the rewards are plain Python functions in
TRL's convention (columns as keyword lists). Run it on a tiny model in seconds:

    mmrlvr tiny qwen2.5-vl --out runs/tiny-qwen25vl
    python examples/trl_grpo.py --model runs/tiny-qwen25vl --out runs/trl-port --steps 2
"""
from __future__ import annotations

import argparse
import random
import re

import datasets
from PIL import Image, ImageDraw

from mmrlvr import GRPOTrainer, load_config


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
    args = load_config(None, [
        f"train.out_dir={a.out}", f"train.steps={a.steps}", "train.batch_prompts=2",
        "train.micro_batch=16", f"train.save_every={a.steps}", "train.eval_batch=4",
        "rollout.group_size=4", "rollout.max_new_tokens=16", "optim.lr=1e-4",
        "model.min_pixels=3136", "model.max_pixels=3136", "train.report_to=[]"])
    trainer = GRPOTrainer(model=a.model, reward_funcs=[accuracy_reward, (format_reward, 0.1)],
                          args=args, train_dataset=train_ds, eval_dataset=eval_ds,
                          overwrite=a.overwrite)
    summary = trainer.train()
    print("summary:", summary)
    print("evaluate:", trainer.evaluate())


if __name__ == "__main__":
    main()
