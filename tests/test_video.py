"""Video through the Qwen-VL families: a `videos` row reaches the model as its family's video
tokens (Qwen2.5-VL: seconds per temporal patch in the positions; Qwen3-VL: timestamps in the
text, DeepStack features), padding invariance and the rollout-vs-trainer gap hold for a batch
mixing text-only, image, interleaved two-image and video rows, such a dataset trains (one
process here; two in test_multiprocess), a family without a video path refuses the row by name,
and the demo answers about an uploaded video."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image, ImageDraw

import modalities
from mmrlvr.config import ModelConfig, load_config
from mmrlvr.data import DataError, Example, load_dataset
from mmrlvr.data.video import write_video
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.policy import Policy
from tests.test_families import assert_padding_invariant, assert_rollout_matches_trainer

KINDS = ["qwen2.5-vl", "qwen3-vl"]


def moving_square(n: int = 8, size: int = 56, step: int = 5, reverse: bool = False
                  ) -> list[Image.Image]:
    """`n` frames of a red square moving right (left when `reverse`) on black."""
    frames = []
    for i in range(n):
        x = 4 + step * (n - 1 - i if reverse else i)
        img = Image.new("RGB", (size, size), (0, 0, 0))
        ImageDraw.Draw(img).rectangle([x, 22, x + 11, 33], fill=(230, 30, 30))
        frames.append(img)
    return frames


def write_mixed(root: Path) -> Path:
    """A JSONL file of a text-only, a one-image, a two-image interleaved and two video rows
    (mp4 files written with PyAV; one video interleaved after text)."""
    Image.new("RGB", (56, 56), (200, 0, 0)).save(root / "a.png")
    Image.new("RGB", (84, 56), (0, 0, 200)).save(root / "b.png")
    write_video(root / "right.mp4", moving_square(), fps=4)
    write_video(root / "left.mp4", moving_square(reverse=True), fps=4)
    rows = [
        {"id": "text", "prompt": "What is 2 + 3?", "answer": "5"},
        {"id": "one", "prompt": "What colour is the shape?", "images": ["a.png"], "answer": "red"},
        {"id": "two", "prompt": "Compare <image> and <image>: same colour?",
         "images": ["a.png", "b.png"], "answer": "no"},
        {"id": "video", "prompt": "Which way does the square move?", "videos": ["right.mp4"],
         "answer": "right"},
        {"id": "video-il", "prompt": "In this clip <video> does the square move left or right?",
         "videos": ["left.mp4"], "answer": "left"},
    ]
    path = root / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_rank_rows(root: Path) -> Path:
    """The rows of `write_mixed` with text-only ones between: under 2 processes rank 0 draws a
    video, an image and a two-image row, rank 1 three text-only rows (rank r: rows r, r + 2, ...)."""
    rows = {json.loads(line)["id"]: json.loads(line)
            for line in write_mixed(root).read_text().splitlines()}
    text = [dict(rows["text"], id=f"text-{k}", prompt=f"What is {k} + 3?", answer=str(k + 3))
            for k in range(3)]
    order = [rows["video"], text[0], rows["one"], text[1], rows["two"], text[2]]
    path = root / "ranks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in order))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("video-data"))


def _policy(path: Path) -> Policy:
    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(path)), modalities.get("vision", max_frames=8, video_fps=4.0),
                       torch.device("cpu"))


@pytest.mark.parametrize("kind", KINDS)
def test_a_video_row_becomes_the_familys_video_tokens_and_its_frames_matter(kind, tiny_dirs, data):
    policy = _policy(tiny_dirs(kind))
    examples = {e.id: e for e in load_dataset(str(data))}
    batch = policy.adapter.encode([examples["video"]], policy.processor)
    grid = batch.inputs["video_grid_thw"]
    assert grid.tolist() == [[4, 4, 4]]     # 8 frames, 2 a temporal patch; 56 (64) px sides
    merge = policy.family.merge_size(policy.processor)
    pad = policy.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert int((batch.inputs["input_ids"] == pad).sum()) == int(grid.prod()) // merge ** 2
    text = policy.tokenizer.decode(batch.inputs["input_ids"][0])
    if kind == "qwen3-vl":                   # timestamps of each temporal patch, from the fps
        assert [f"<{t} seconds>" in text for t in ("0.1", "0.6", "1.1", "1.6")] == [True] * 4, text
    else:                                    # 2 frames a patch at 4 fps: 0.5 s
        assert batch.inputs["second_per_grid_ts"].tolist() == [0.5]
    ids = torch.randint(0, len(policy.tokenizer) - 40, (1, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    backwards = Example(id="rev", prompt=examples["video"].prompt, answer="left",
                        videos=[str(data.parent / "left.mp4")])
    with torch.no_grad():
        fwd, _ = policy.completion_logprobs(batch.inputs, ids, mask)
        rev, _ = policy.completion_logprobs(
            policy.adapter.encode([backwards], policy.processor).inputs, ids, mask)
    assert (fwd - rev).abs().max() > 1e-4                 # the model sees the frames' order


@pytest.mark.parametrize("kind", KINDS)
def test_mixed_batch_with_video_is_padding_invariant_and_rollout_matches_trainer(kind, tiny_dirs, data):
    policy = _policy(tiny_dirs(kind))
    examples = load_dataset(str(data))
    n = len(examples)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, len(policy.tokenizer) - 40, (n, 9), generator=gen)
    mask = torch.ones_like(ids)
    for i in range(n):
        mask[i, 3 + i:] = 0
    assert_padding_invariant(policy, examples, ids, mask)
    assert_rollout_matches_trainer(policy, policy.adapter.encode(examples, policy.processor), 2, 8)


@pytest.mark.slow
@pytest.mark.parametrize("kind, packing", [("qwen2.5-vl", False), ("qwen3-vl", True)])
def test_a_dataset_of_text_images_and_video_trains_in_one_run(kind, packing, tiny_dirs, data, tmp_path):
    import yaml

    from mmrlvr.train.trainer import train

    cfg = {"model": {"path": str(tiny_dirs(kind))},
           "data": {"train": str(data), "eval": str(data), "max_frames": 8, "video_fps": 4.0},
           "rollout": {"group_size": 2, "max_new_tokens": 4},
           "train": {"steps": 2, "batch_prompts": 5, "micro_batch": 4, "save_every": 0,
                     "eval_every": 2, "packing": packing, "out_dir": str(tmp_path / "run"),
                     "seed": 1},
           "rewards": [{"name": "accuracy", "weight": 0.5},
                       {"name": str(tmp_path / "len.py") + ":length", "weight": 0.5}]}
    (tmp_path / "len.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 20) / 20.0\n")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    train(load_config(tmp_path / "c.yaml"))
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [m for m in metrics if "loss/policy" in m]
    assert len(steps) == 2 and all(torch.isfinite(torch.tensor(m["loss/policy"])) for m in steps)
    assert any("eval/accuracy" in m for m in metrics)


def test_a_family_without_a_video_path_names_the_row(tiny_dirs, data):
    policy = _policy(tiny_dirs("gemma3"))
    video = next(e for e in load_dataset(str(data)) if e.id == "video")
    with pytest.raises(DataError, match="sample video: 1 video.*no video path for the gemma3"):
        policy.adapter.encode([video], policy.processor)


def test_the_demo_answers_about_an_uploaded_video(tiny_dirs, data):
    from apps.common import DemoContext
    from apps.vision_tab import answer

    ctx = DemoContext(policy=_policy(tiny_dirs("qwen2.5-vl")))
    updates = list(answer(ctx, [str(data.parent / "right.mp4")], "Which way does it move?",
                          gold="right"))
    status = updates[-1][-1]
    assert status.startswith("✓ done"), status
    assert "video 1: 8 frames of 56×56 from 2.0 s" in status
    broken = data.parent / "broken.mp4"
    broken.write_bytes(b"not a video at all" * 10)
    status = list(answer(ctx, [str(broken)], "Which way?"))[-1][-1]
    assert "video 1 (broken.mp4) cannot be used" in status, status
