"""Media where the user's text puts them: `<image>` markers preceded by text keep their places
(each image goes where its marker stands, in order); markers that all stand first are the old
"media first"; a count that disagrees with the media is named by row; a dataset mixing text-only,
one-image and two-image interleaved rows trains."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import modalities
from mmrlvr.config import ModelConfig, load_config
from mmrlvr.data import DataError, load_dataset
from mmrlvr.train.policy import Policy


@pytest.fixture()
def rows(tmp_path) -> Path:
    Image.new("RGB", (56, 56), (200, 0, 0)).save(tmp_path / "a.png")
    Image.new("RGB", (56, 56), (0, 0, 200)).save(tmp_path / "b.png")
    data = [
        {"id": "il", "prompt": "Compare <image> and <image>: same colour?", "images": ["a.png", "b.png"],
         "answer": "no"},
        {"id": "front", "prompt": "<image>\nHow many shapes?", "images": ["a.png"], "answer": "1"},
        {"id": "parts", "prompt": [{"role": "user", "content": [
            {"type": "text", "text": "Is"}, {"type": "image"}, {"type": "text", "text": "red?"}]}],
         "images": ["a.png"], "answer": "yes"},
        {"id": "text", "prompt": "What is 2 + 2?", "answer": "4"},
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data))
    return tmp_path / "d.jsonl"


def test_markers_after_text_keep_their_places_and_leading_ones_go_first(rows):
    by_id = {e.id: e for e in load_dataset(str(rows))}
    assert by_id["il"].prompt == "Compare <image> and <image>: same colour?"
    assert by_id["front"].prompt == "How many shapes?"                 # media first, as before
    assert by_id["parts"].prompt == "Is\n<image>\nred?"
    adapter = modalities.get("vision")
    parts = adapter.build_messages(by_id["il"])[0]["content"]
    assert [p["type"] for p in parts] == ["text", "image", "text", "image", "text"]
    assert [p.get("text") for p in parts if p["type"] == "text"] == ["Compare ", " and ",
                                                                     ": same colour?"]


@pytest.mark.parametrize("kind", ["qwen2.5-vl", "qwen3-vl", "gemma3"])
def test_each_image_reaches_the_model_where_its_marker_stands(kind, rows, tmp_path):
    from mmrlvr.tiny import build_tiny

    model = build_tiny(kind, tmp_path / kind)
    policy = Policy.load(ModelConfig(path=str(model)), modalities.get("vision"), torch.device("cpu"))
    example = next(e for e in load_dataset(str(rows)) if e.id == "il")
    batch = policy.adapter.encode([example], policy.processor)
    text = policy.tokenizer.decode(batch.inputs["input_ids"][0])
    first, second, end = text.index("Compare"), text.index("and"), text.index(": same colour?")
    bos = policy.tokenizer.bos_token
    assert bos is None or text.count(bos) <= 1                  # the template's own, not twice
    token = policy.family.image_token
    per_image = text.count(token) // 2
    assert per_image > 0 and text[:first].count(token) == 0     # nothing before the question
    assert text[first:second].count(token) == per_image         # one image between each pair
    assert text[second:end].count(token) == per_image


def test_a_marker_count_that_disagrees_with_the_media_names_the_row(tmp_path):
    Image.new("RGB", (56, 56)).save(tmp_path / "a.png")
    (tmp_path / "bad.jsonl").write_text(json.dumps(
        {"id": "two-markers", "prompt": "Compare <image> and <image>", "images": ["a.png"],
         "answer": "x"}) + "\n")
    with pytest.raises(DataError, match=r"two-markers|row 1"):
        load_dataset(str(tmp_path / "bad.jsonl"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2.5-vl", "qwen3-vl"])
def test_text_single_and_interleaved_rows_train_together(kind, rows, tmp_path):
    from mmrlvr.tiny import build_tiny
    from mmrlvr.train.logger import read_metrics
    from mmrlvr.train.trainer import train

    model = build_tiny(kind, tmp_path / kind)
    (tmp_path / "len.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 20) / 20.0\n")
    cfg = load_config(None, [f"model.path={model}", f"data.train={rows}", f"data.eval={rows}",
                             f"rewards=[{{name: accuracy, weight: 0.9}}, "
                             f"{{name: '{tmp_path / 'len.py'}:length', weight: 0.5}}]",
                             "rollout.group_size=2", "rollout.max_new_tokens=4",
                             "train.batch_prompts=4", "train.steps=2", "train.micro_batch=4",
                             "train.eval_every=2", f"train.out_dir={tmp_path / 'run'}"])
    summary = train(cfg, progress=False)
    assert summary["eval_rows"] == 4
    gaps = [r["rollout/logprob_gap"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")
            if "rollout/logprob_gap" in r]
    assert gaps and max(gaps) < 1e-4
