"""An audio run from Python: a tiny Qwen2-Audio answers questions about synthetic tones.

The clips are `mmrlvr data tones`' (beeps to count, which tone is higher, which half is louder),
made in memory as arrays and handed over as `{"array", "sampling_rate"}` clips; the trainer
writes them as WAV files into the run dir. The reward is a plain function on the option letter.

    mmrlvr tiny qwen2-audio --out runs/tiny-qwen2audio
    python examples/audio_tones.py --model runs/tiny-qwen2audio --out runs/tones-api --steps 2
"""
from __future__ import annotations

import argparse
import random
import re

from mmrlvr import GRPOTrainer, load_config
from mmrlvr.tasks.tones import ANSWER_CELLS, SR, make_item, with_options


def letter_reward(completions, answer, **kwargs):
    """1 where the answer tag holds the right option letter (TRL's signature)."""
    found = [re.search(r"<answer>\s*([A-Z])", c) for c in completions]
    return [float(bool(m) and m.group(1) == gold) for m, gold in zip(found, answer)]


def tones(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        family = ("count", "pitch", "loudness")[i % 3]
        item = make_item(family, rng, rng.choice(ANSWER_CELLS[family]), clip_s=2.0)
        rows.append({"prompt": with_options(item["question"], item["choices"]),
                     "audios": [{"array": item["wave"], "sampling_rate": SR}],
                     "choices": item["choices"],
                     "answer": chr(65 + item["choices"].index(item["gold"]))})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model dir (e.g. from `mmrlvr tiny qwen2-audio`)")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args()

    args = load_config(None, [
        "model.modality=audio", "model.freeze_audio=true", f"train.out_dir={a.out}",
        f"train.steps={a.steps}", "train.batch_prompts=2", "train.micro_batch=16",
        "train.save_every=0", "rollout.group_size=4", "rollout.max_new_tokens=12",
        "train.report_to=[]"])
    trainer = GRPOTrainer(model=a.model, args=args, train_dataset=tones(12, seed=0),
                          reward_funcs=[letter_reward], overwrite=a.overwrite)
    print("summary:", trainer.train())


if __name__ == "__main__":
    main()
