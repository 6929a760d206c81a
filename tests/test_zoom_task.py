"""The zoom task (mmrlvr/tasks/zoom.py) and SFT on gold tool trajectories
(mmrlvr/train/sft_tools.py): the shapes are below one patch where the prompt shows them and whole in the zoom's crop, the gold
trajectory's call parses and its crop holds the answer, SFT on trajectories trains the policy's
tokens only (the tool turn is masked), and after that warm start GRPO with the tool runs with
calls the policy wrote itself (nothing scripted)."""
from __future__ import annotations

import json

from pathlib import Path

import numpy as np
import pytest
import torch

from mmrlvr.core.trajectory import parse_call
from mmrlvr.tasks.zoom import BOXES, COLORS, PATCH, ZOOM_FACTOR, make_zoom
from mmrlvr.tools.builtin import zoom

VIEW = 56          # the prompt's side in these tests: max_pixels 56*56 (4 image tokens)
PIXELS = VIEW * VIEW


@pytest.fixture(scope="module")
def zoom_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoom")
    make_zoom(out, n_train=24, n_test=8, seed=0, view=VIEW)
    return out


def rows(data_dir: Path, split: str = "train"):
    from mmrlvr.data.loading import load_jsonl

    return load_jsonl(data_dir / f"{split}.jsonl")


def components(mask: np.ndarray) -> int:
    """4-connected components of a boolean image (the shapes never touch: one cell each)."""
    seen, n = np.zeros_like(mask), 0
    for y, x in zip(*np.nonzero(mask)):
        if seen[y, x]:
            continue
        n += 1
        stack = [(y, x)]
        while stack:
            cy, cx = stack.pop()
            if 0 <= cy < mask.shape[0] and 0 <= cx < mask.shape[1] and mask[cy, cx] \
                    and not seen[cy, cx]:
                seen[cy, cx] = True
                stack += [(cy + 1, cx), (cy - 1, cx), (cy, cx + 1), (cy, cx - 1)]
    return n


def grid_side(processor, image) -> int:
    """The side in pixels the family shows `image` at (its patch grid x the patch)."""
    out = processor.image_processor(images=[image], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    assert h == w
    return h * PATCH


@pytest.fixture(scope="module")
def processor(tiny_vl):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(tiny_vl)
    proc.image_processor.size = {"shortest_edge": PIXELS, "longest_edge": PIXELS}
    return proc


def test_the_shapes_are_below_one_patch_in_the_prompt_and_whole_in_the_crop(zoom_dir, processor):
    from PIL import Image

    shared = 0
    for ex in rows(zoom_dir):
        meta = ex.meta
        with Image.open(zoom_dir / ex.images[0]) as im:
            im.load()
            stored = im.size[0]
            assert im.size == (VIEW * ZOOM_FACTOR, VIEW * ZOOM_FACTOR) == (meta["image_side"],) * 2
            prompt_side = grid_side(processor, im)
        assert prompt_side == VIEW                          # what the prompt shows: 4x down
        scale = prompt_side / stored
        for s in meta["shapes"]:
            assert s["size"] * scale < PATCH / 2           # every shape: under half a patch
        box = meta["box"]
        assert box["w"] * scale <= 2 * PATCH                # the asked box: 2 x 2 patches
        cells = [((s["x"] - box["x"]) * scale // PATCH, (s["y"] - box["y"]) * scale // PATCH)
                 for s in meta["evidence"]]
        shared += len(cells) > len(set(cells))              # two shapes in one patch
        crop = zoom(ex, **parse_call(meta["trajectory"][0]["text"])[0].arguments)
        crop_side = grid_side(processor, crop)
        assert crop.size == (box["w"], box["h"]) and crop_side == box["w"]   # shown 1:1
        assert (crop_side / crop.size[0]) / scale == ZOOM_FACTOR     # the crop: 4x the prompt
        for s in meta["evidence"]:                                  # every shape whole in it
            half = s["size"] // 2
            assert 0 <= s["x"] - half and s["x"] - half + s["size"] <= box["w"]
            assert 0 <= s["y"] - half and s["y"] - half + s["size"] <= box["h"]
    assert shared >= 1            # in some rows the prompt's patches hold several shapes


def test_the_gold_call_parses_and_its_crop_shows_the_answer(zoom_dir):
    families = set()
    for ex in rows(zoom_dir) + rows(zoom_dir, "test"):
        turns = ex.meta["trajectory"]
        call, why = parse_call(turns[0]["text"])
        assert call is not None and not why and call.name == "zoom"
        assert call.arguments == ex.meta["box"] and len(turns) == 2
        assert parse_call(turns[1]["text"]) == (None, "")
        assert turns[1]["text"].endswith(f"<answer>{ex.answer}</answer>")
        pixels = np.asarray(zoom(ex, **call.arguments), dtype=int)
        ink = (pixels != 255).any(axis=2)
        family = ex.meta["family"]
        families.add(family)
        if family == "count":
            assert components(ink) == int(ex.answer) == len(ex.meta["evidence"])
        else:
            colours = {tuple(p) for p in pixels[ink]}
            assert colours == {COLORS[ex.answer]}, ex.id
        side = ex.meta["image_side"] // BOXES
        for s in ex.meta["evidence"]:                       # evidence in crop pixels, inside it
            assert 0 <= s["x"] < side and 0 <= s["y"] < side
    assert families == {"count", "color"}


def test_the_vision_rows_label_each_box_and_the_crop(zoom_dir):
    from PIL import Image

    from mmrlvr.data.loading import load_jsonl

    vision = {ex.id: ex for ex in load_jsonl(zoom_dir / "vision.jsonl")}
    for ex in rows(zoom_dir):
        box = ex.meta["box"]
        index = (box["y"] // box["h"]) * BOXES + box["x"] // box["w"]
        whole = vision[f"{ex.id}-image"].meta["vision_labels"]
        crop = vision[f"{ex.id}-box"]
        n = len(ex.meta["evidence"])
        assert whole[f"n{index:02d}"] == crop.meta["vision_labels"]["crop_n"] == str(n)
        assert sum(int(whole[f"n{i:02d}"]) for i in range(BOXES * BOXES)) == len(ex.meta["shapes"])
        if ex.meta["family"] == "color":
            assert crop.meta["vision_labels"]["crop_c"] == whole[f"c{index:02d}"] == ex.answer
        with Image.open(crop.images[0]) as im:
            assert im.size == (box["w"], box["h"])


def test_the_task_is_registered_and_repeatable(tmp_path):
    from mmrlvr.tasks import TASKS, TaskOptions

    task = TASKS.get("zoom")
    a = task.make(tmp_path / "a", TaskOptions(n_train=4, n_test=2, seed=1, image_size=VIEW))
    task.make(tmp_path / "b", TaskOptions(n_train=4, n_test=2, seed=1, image_size=VIEW))
    assert a["image_side"] == VIEW * ZOOM_FACTOR
    for name in ("train.jsonl", "test.jsonl", "vision.jsonl", "images/train-000003.png",
                 "images/test-000001-box.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    with pytest.raises(ValueError, match="multiple of 28"):
        make_zoom(tmp_path / "c", n_train=1, n_test=1, view=60)


def zoom_policy(model_dir):
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.train.policy import Policy

    torch.manual_seed(0)
    cfg = ModelConfig(path=str(model_dir), min_pixels=PIXELS, max_pixels=PIXELS)
    return Policy.load(cfg, modalities.get("vision", min_pixels=PIXELS, max_pixels=PIXELS),
                       torch.device("cpu"))


def test_sft_on_a_trajectory_trains_the_call_and_the_answer_not_the_tool_turn(zoom_dir, tiny_vl):
    from mmrlvr.core.types import select
    from mmrlvr.tools import build_runner
    from mmrlvr.train.sft_tools import trajectory_targets

    policy = zoom_policy(tiny_vl)
    examples = rows(zoom_dir)[:3]
    prompts = policy.adapter.encode(examples, policy.processor)
    batch, ids, mask, train = trajectory_targets(policy, examples, prompts,
                                                 build_runner([{"name": "zoom"}]))
    tok = policy.tokenizer
    image = tok.convert_tokens_to_ids("<|image_pad|>")
    for i, ex in enumerate(examples):
        n = int(mask[i].sum())
        row, keep = ids[i, :n], train[i, :n].bool()
        assert int((row == image).sum()) == 4                  # the crop: 4 tokens at 56 px
        assert not bool(keep[row == image].any())              # ... none of them trained
        call, answer = (t["text"] for t in ex.meta["trajectory"])
        assert tok.decode(row[keep]) == call + answer + tok.decode([policy.eos_ids[0]])
        tool_turn = tok.decode(row[~keep])
        assert tool_turn.startswith("<|im_end|>\n<|im_start|>tool\n")
        assert tool_turn.endswith("<|im_start|>assistant\n")
        assert bool(keep[:len(tok(call, add_special_tokens=False)["input_ids"])].all())
        assert not bool(train[i, n:].any())                    # padding
    # every row's prompt carries its own image and the crop's: the forward places both
    assert batch.inputs["image_grid_thw"].shape[0] == 2 * len(examples)
    inputs, _ = select(batch, list(range(len(examples))))
    logp, _ = policy.completion_logprobs(inputs, ids, mask)
    assert torch.isfinite(logp[train.bool()]).all()


def test_a_gold_trajectory_that_is_not_a_call_is_named(zoom_dir):
    from mmrlvr.data import DataError
    from mmrlvr.train.sft_tools import gold_turns

    ex = rows(zoom_dir)[0]
    ex.meta = {**ex.meta, "trajectory": [{"text": "no call here"}, {"text": "<answer>1</answer>"}]}
    with pytest.raises(DataError, match=f"sample {ex.id}: turn 0 of meta.trajectory is not a tool"):
        gold_turns(ex)
    ex.meta = {k: v for k, v in ex.meta.items() if k != "trajectory"}
    with pytest.raises(DataError, match="needs a gold trajectory"):
        gold_turns(ex)


def test_grpo_with_the_tool_after_the_warm_start_calls_it_unscripted(tmp_path):
    """SFT on two rows' gold trajectories teaches the call; GRPO's rollouts then make it. The
    tokenizer learns the rows' text, trajectories included, as `mmrlvr tiny --corpus` does."""
    from tests.tool_warm_start import grpo_tool_steps, warm_start

    data = tmp_path / "zoom"
    make_zoom(data, n_train=2, n_test=2, seed=0, view=VIEW, families=["count"])
    common = [f"model.min_pixels={PIXELS}", f"model.max_pixels={PIXELS}",
              f"data.train={data / 'train.jsonl'}", "rollout.backend=hf", "rollout.max_turns=2",
              "rollout.tools=[{name: zoom}]", "rollout.max_trajectory_tokens=160",
              "rollout.max_new_tokens=60", "train.seed=0", "train.threads=1",
              "rewards=[{name: accuracy, weight: 0.9}, {name: turn_format, weight: 0.1}]"]
    model, sft_log = warm_start(tmp_path, "qwen2.5-vl", data, common)
    assert sft_log[-1]["sft/loss"] < 0.1 * sft_log[0]["sft/loss"]
    steps = grpo_tool_steps(tmp_path, model, common + [f"data.eval={data / 'test.jsonl'}"])
    assert len(steps) == 2
    assert sum(r["tools/calls_per_rollout"] for r in steps) > 0       # the policy's own calls
    assert sum(r.get("tools/results_image", 0) for r in steps) > 0    # ... that gave crops
    # the eval records keep each question's whole trajectory, its last turn as the completion
    records = [json.loads(x) for x in (tmp_path / "grpo" / "eval" / "step-2.jsonl").open()]
    assert len(records) == 2
    for rec in records:
        turns = rec["trajectory"]["turns"]
        assert turns and rec["completion"] == turns[-1]["text"]
        assert rec["trajectory"]["ended"] in ("answer", "max_turns", "budget", "bad_call")
    assert any(t["call"] is not None for rec in records for t in rec["trajectory"]["turns"])
