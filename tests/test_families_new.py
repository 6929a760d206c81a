"""The families added after the first model-family layer (SmolVLM, LLaVA-OneVision, Mistral 3,
GLM-4.1V) on tiny random models of their real classes: each image's placeholder is counted
against the row's images, a text-only row beside image rows encodes with no image token, the
image tokens the processor writes equal the features the model's own tower makes for that row
(the count-mismatch bug class), and a processor that does not match its model is named before
the first step. Padding invariance, the rollout-vs-trainer gap, 2 GRPO steps with eval, resume,
LoRA, `mmrlvr eval` and the demo: tests/test_families.py, which runs every family."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

import modalities
from mmrlvr import models
from mmrlvr.config import ModelConfig
from mmrlvr.data import DataError, Example
from mmrlvr.tiny import KINDS
from mmrlvr.train.policy import Policy, PolicyError

NEW = [k for k in ("smolvlm", "llava-onevision", "mistral3", "glm4v") if k in KINDS]


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """A text-only row, one image, two images of other sizes and aspect."""
    root = tmp_path_factory.mktemp("new-family-images")
    for name, size, colour in (("a", (56, 56), (220, 20, 20)), ("b", (112, 80), (20, 60, 220))):
        Image.new("RGB", size, colour).save(root / f"{name}.png")
    a, b = str(root / "a.png"), str(root / "b.png")
    return [Example(id="text", prompt="What is 2 + 3?", answer="5"),
            Example(id="one", prompt="What colour is the shape?", answer="red", images=[a]),
            Example(id="two", prompt="How many shapes are in these two pictures?", answer="2",
                    images=[b, a])]


def _policy(path) -> Policy:
    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(path)), modalities.get("vision"), torch.device("cpu"))


@pytest.mark.parametrize("kind", NEW)
def test_image_tokens_equal_what_the_model_makes_row_by_row(kind, tiny_dirs, rows):
    policy = _policy(tiny_dirs(kind))
    family = policy.family
    assert family.name == kind and models.resolve(str(tiny_dirs(kind))) is family
    batch = policy.adapter.encode(rows, policy.processor)
    token = policy.tokenizer.convert_tokens_to_ids(family.image_token)
    counts = (batch.inputs["input_ids"] == token).sum(dim=1).tolist()
    assert counts[0] == 0 and batch.media_rows[0] == {}          # the text-only row
    assert counts[1] > 0 and counts[2] > 0      # (LLaVA-OneVision: two images, fewer tokens)
    with torch.no_grad():
        for i in (1, 2):
            alone = policy.adapter.encode(rows[i:i + 1], policy.processor)
            encoded = family.encode_images(policy.model, alone.inputs, torch.device("cpu"),
                                           policy.dtype)
            picked = family.pick_features(encoded, [alone.media_rows[0][family.image_key]])
            made = sum(f.reshape(-1, f.shape[-1]).shape[0] for f in picked.pooler_output)
            assert made == counts[i] == family.image_features(batch.inputs, batch.media_rows[i],
                                                              policy.processor), rows[i].id


@pytest.mark.parametrize("kind", NEW)
def test_a_literal_placeholder_in_the_question_is_a_named_data_error(kind, tiny_dirs, rows):
    """A question holding the chat template's own placeholder text is refused by sample id.
    SmolVLM's placeholder is `<image>`, mmrlvr's interleaving marker too: one such marker is where
    the image goes; more markers than images are refused."""
    policy = _policy(tiny_dirs(kind))
    marker = policy.family.image_marker or policy.family.image_token
    if marker == "<image>":
        placed = Example(id="placed", prompt="Look: <image> how many?", answer="1",
                         images=rows[1].images)
        text = policy.adapter.encode([placed], policy.processor).prompt_texts[0]
        assert text.count("<image>") == 1 and "Look:" in text   # where: the template's choice
        bad, match = f"Look: {marker} {marker} how many?", r"sample bad-7: its question marks more"
    else:
        bad, match = f"Look: {marker} how many?", r"sample bad-7: the prompt holds 2 image placeholders"
    with pytest.raises(DataError, match=match):
        policy.adapter.encode([Example(id="bad-7", prompt=bad, answer="1", images=rows[1].images)],
                              policy.processor)


@pytest.mark.parametrize("kind", NEW)
def test_the_family_answers_offline_for_planning(kind, tiny_dirs):
    """Tokens an image makes at the pixel bound, from config.json alone, and a published release
    of the family that `mmrlvr plan` builds on the meta device."""
    family = models.get(kind)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_dirs(kind))
    assert family.tokens_per_image(config, 112 * 112) > 0
    assert family.published, f"{kind}: no published dims"
    for hub, dims in family.published.items():
        assert models.of_type(dims["model_type"]) is family, hub


def _copy(src: Path, dst: Path) -> Path:
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_smolvlm_processor_with_another_square_size_is_named(tiny_dirs, tmp_path):
    if "smolvlm" not in NEW:
        pytest.skip("no tiny smolvlm")
    path = _copy(tiny_dirs("smolvlm"), tmp_path)
    cfg = json.loads((path / "processor_config.json").read_text())
    cfg["image_seq_len"] = 9
    (path / "processor_config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyError, match=r"it writes 9 <image> tokens a square, the smolvlm "
                                          r"model's config.json makes 4"):
        _policy(path)


def test_mistral3_images_keep_their_aspect_within_max_pixels_and_a_tiny_one_still_encodes(
        tiny_dirs, tmp_path):
    """Pixtral sizes images by aspect: a 3:1 image shrunk to model.max_pixels keeps more columns
    than rows of [IMG] and takes no more prompt tokens than the family's planning bound; a 6 px
    image (one 16 px cell) is stretched over two cells (transformers' Mistral 3 cannot split a
    lone one-feature image), and the features the tower makes are exactly the [IMG] tokens."""
    if "mistral3" not in NEW:
        pytest.skip("no tiny mistral3")
    policy = _policy(tiny_dirs("mistral3"))
    family, tok = policy.family, policy.tokenizer
    Image.new("RGB", (300, 100), (0, 200, 0)).save(tmp_path / "wide.png")
    Image.new("RGB", (6, 6), (0, 0, 200)).save(tmp_path / "dot.png")
    marks = [tok.convert_tokens_to_ids(t) for t in family.placeholder_tokens]   # IMG, BREAK, END
    sizes = {}
    for name in ("wide", "dot"):
        ex = Example(id=name, prompt="What is it?", answer="x", images=[str(tmp_path / f"{name}.png")])
        batch = policy.adapter.encode([ex], policy.processor)
        (h, w), = batch.inputs["image_sizes"].tolist()
        ids = batch.inputs["input_ids"][0]
        tokens = int((ids == marks[0]).sum())
        assert tokens == (h // 16) * (w // 16) > 1, name
        assert int(torch.isin(ids, torch.tensor(marks)).sum()) <= family.tokens_per_image(
            policy.model.config, policy.adapter.max_pixels), name
        with torch.no_grad():
            out = family.encode_images(policy.model, batch.inputs, torch.device("cpu"), policy.dtype)
        assert sum(f.shape[0] for f in out.pooler_output) == tokens, name
        sizes[name] = (h, w)
    assert sizes["wide"] == (32, 64)      # 300x100 -> 193x64 (max_pixels) -> 63x21 (64 px edge)
    assert sizes["dot"] == (32, 32)       # 6x6 -> 17x17 -> two cells a side


def test_a_mistral3_processor_with_another_patch_size_is_named(tiny_dirs, tmp_path):
    if "mistral3" not in NEW:
        pytest.skip("no tiny mistral3")
    path = _copy(tiny_dirs("mistral3"), tmp_path)
    cfg = json.loads((path / "processor_config.json").read_text())
    cfg["patch_size"] = 14
    (path / "processor_config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyError, match=r"its patch_size is 14, the mistral3 model's config.json "
                                          r"gives 8"):
        _policy(path)


def test_a_glm4v_processor_that_merges_otherwise_is_named_and_a_video_row_refused(tiny_dirs,
                                                                                 tmp_path, rows):
    if "glm4v" not in NEW:
        pytest.skip("no tiny glm4v")
    policy = _policy(tiny_dirs("glm4v"))
    video = Example(id="clip-3", prompt="What moves?", answer="x", videos=[rows[1].images[0]])
    with pytest.raises(DataError, match=r"sample clip-3: 1 video\(s\), but mmrlvr has no video path "
                                        r"for the glm4v family"):
        policy.adapter.encode([video], policy.processor)
    path = _copy(tiny_dirs("glm4v"), tmp_path)
    cfg = json.loads((path / "processor_config.json").read_text())
    cfg["image_processor"]["merge_size"] = 1
    (path / "processor_config.json").write_text(json.dumps(cfg))
    with pytest.raises(PolicyError, match=r"it merges 1x1 patches, the glm4v model's config.json 2x2"):
        _policy(path)
