"""Benchmark: encoding each prompt's audio once per group vs once per rollout (Qwen2-Audio).

Workload: a tiny random-weight Qwen2-Audio (`mmrlvr.tiny.audio.build_tiny_audio`, 0.9 M parameters,
audio encoder 2 layers x 64 wide), B prompts of one 2 s tone clip each (50 audio tokens), G
rollouts per prompt, float32, CPU (CUDA when present). Run for two feature windows: the tiny
default (3 s) and the real model's (30 s), where the Whisper encoder always sees a full window of
mel frames, so its cost grows with the window, not with the clip.

Two phases of a GRPO step, each timed both ways on identical inputs:

  rollout    `generate(num_return_sequences=G, max_new_tokens=16)`:
               per rollout   the stock path: `input_features` go to `generate`, which repeats them
                             G times, so the encoder runs on B*G clips;
               once          mmrlvr's path (`AudioAdapter.generation_inputs`): the encoder runs on
                             the B clips, `inputs_embeds` are repeated instead.
  recompute  one forward + backward of the B*G completions' logprobs (16 tokens each):
               per rollout   `input_features` repeated per row (what `select` gives the model);
               once          `shared_media` + `apply_media`: B clips encoded, features scattered
                             into every copy (gradients add up over the copies).

Figures: median wall seconds over the repeats, the encoder's share, and the saving.

    python bench/audio_encode_once.py                          # B 4, G 8, windows 3 and 30 s
    python bench/audio_encode_once.py --prompts 8 --group 8 --windows 3 --repeats 5

A benchmark prints figures; nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def _clip(seconds: float = 2.0, freq: float = 440.0) -> tuple[np.ndarray, int]:
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.4 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 16000


def _timed(fn, repeats: int) -> float:
    fn()                                                     # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(window: int, prompts: int, group: int, repeats: int, workdir: Path) -> dict[str, float]:
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.data import Example
    from mmrlvr.train.policy import Policy, pick_device
    from mmrlvr.tiny.audio import build_tiny_audio
    from mmrlvr.core.types import select, to_device

    model_dir = workdir / f"tiny-audio-{window}s"
    if not (model_dir / "config.json").exists():
        build_tiny_audio("qwen2-audio", model_dir, audio_window=window)
    policy = Policy.load(ModelConfig(path=str(model_dir), modality="audio"), modalities.get("audio"),
                         pick_device("auto"))
    examples = [Example(id=f"b{i}", prompt="How many beeps are in the clip?", answer="A",
                        audios=[_clip(freq=300 + 50 * i)]) for i in range(prompts)]
    batch = policy.adapter.encode(examples, policy.processor)
    model, adapter = policy.model, policy.adapter
    encoder_s, clips = [], []

    def start(module, args):
        clips.append(args[0].shape[0])
        encoder_s.append(-time.perf_counter())

    model.model.audio_tower.register_forward_pre_hook(start)
    model.model.audio_tower.register_forward_hook(
        lambda m, a, o: encoder_s.append(encoder_s.pop() + time.perf_counter()))
    gen = dict(max_new_tokens=16, min_new_tokens=16, do_sample=True, num_return_sequences=group,
               pad_token_id=policy.pad_id)

    def rollout(once: bool):
        inputs = to_device(batch.inputs, policy.device, policy.dtype)
        if once:
            inputs = adapter.generation_inputs(model, batch, inputs)
        with torch.no_grad():
            model.generate(**inputs, **gen)

    rows = [i for i in range(prompts) for _ in range(group)]
    ids = torch.randint(0, len(policy.tokenizer) - 20, (len(rows), 16))
    mask = torch.ones_like(ids)

    def recompute(once: bool):
        inputs, _ = select(batch, rows)
        media = adapter.shared_media(model, batch, rows, policy.device, policy.dtype) if once else None
        logp, _ = policy.completion_logprobs(inputs, ids, mask, media=media)
        logp.sum().backward()
        model.zero_grad(set_to_none=True)

    out = {}
    for phase, fn in (("rollout", rollout), ("recompute", recompute)):
        for once in (False, True):
            encoder_s.clear()
            clips.clear()
            key = f"{phase}/{'once' if once else 'per_rollout'}"
            out[key] = _timed(lambda fn=fn, once=once: fn(once), repeats)
            out[f"{key}_encoder"] = sum(encoder_s) / (repeats + 1)
            out[f"{key}_clips"] = sum(clips) / (repeats + 1)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--windows", type=int, nargs="*", default=[3, 30], help="feature windows (s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--workdir", help="keep the tiny models here (default: a temp dir)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="audio-bench-"))
    print(f"B={args.prompts} prompts x G={args.group} rollouts, 2 s clips, 16 new tokens, "
          f"device {'cuda' if torch.cuda.is_available() else 'cpu'}, median of {args.repeats}")
    print(f"{'window':>6}  {'phase':<9}  {'clips':>9}  {'per rollout s':>13}  {'(encoder s)':>11}  "
          f"{'once s':>7}  {'(encoder s)':>11}  {'saved':>6}  {'speed-up':>8}")
    for window in args.windows:
        r = run(window, args.prompts, args.group, args.repeats, workdir)
        for phase in ("rollout", "recompute"):
            a, b = r[f"{phase}/per_rollout"], r[f"{phase}/once"]
            n = f"{r[f'{phase}/per_rollout_clips']:.0f}->{r[f'{phase}/once_clips']:.0f}"
            enc_a, enc_b = r[f"{phase}/per_rollout_encoder"], r[f"{phase}/once_encoder"]
            print(f"{window:>5}s  {phase:<9}  {n:>9}  {a:>13.3f}  {enc_a:>11.3f}  "
                  f"{b:>7.3f}  {enc_b:>11.3f}  {100 * (a - b) / a:>5.0f}%  "
                  f"{a / b:>7.2f}x")


if __name__ == "__main__":
    main()
