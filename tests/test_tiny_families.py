"""Tiny random-weight models of the newer families (`mmrlvr.tiny.<family>`): each builds
bit-reproducibly, reloads through the real processor and model classes, writes its placeholder
once per medium in the chat template, expands it to as many tokens as the model makes features
for a padded batch of one media prompt and one text-only prompt, generates, and trains."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from PIL import Image  # noqa: E402

import transformers  # noqa: E402
from mmrlvr.tiny import AUDIO_KINDS, IMAGE_KINDS, KINDS, build_tiny  # noqa: E402


def _qwen3_vl_features(model, enc):
    out = model.get_image_features(enc["pixel_values"], enc["image_grid_thw"])
    # DeepStack: one extra feature list per deepstack layer, each the same length as the merged one
    assert len(out.deepstack_features) == len(model.config.vision_config.deepstack_visual_indexes)
    for layer in out.deepstack_features:
        assert [t.shape for t in layer] == [t.shape for t in out.pooler_output]
    return sum(t.shape[0] for t in out.pooler_output)


def _qwen3_5_features(model, enc):
    out = model.get_image_features(enc["pixel_values"], enc["image_grid_thw"])
    return sum(t.shape[0] for t in out.pooler_output)  # one [tokens, hidden] per image; no DeepStack


def _gemma3_features(model, enc):
    out = model.get_image_features(enc["pixel_values"])
    n_images, per_image, _ = out.pooler_output.shape  # [images, mm_tokens_per_image, hidden]
    assert per_image == model.config.mm_tokens_per_image
    return n_images * per_image


def _tiles_features(model, enc):
    out = model.get_image_features(enc["pixel_values"])
    tiles, per_tile, _ = out.pooler_output.shape  # [tiles of all images, image_seq_length, hidden]
    assert per_tile == model.config.image_seq_length
    return tiles * per_tile


def _batch_rows_features(model, enc):
    # SmolVLM: pixel_values [samples, squares, 3, S, S], zero-padded; one feature block per sample
    out = model.get_image_features(enc["pixel_values"], enc["pixel_attention_mask"])
    return sum(t.shape[0] for t in out.pooler_output)


def _anyres_features(model, enc):
    # LLaVA-OneVision: one [tokens, hidden] per image (base crop + unpadded grid + newlines)
    cfg = model.config
    out = model.get_image_features(enc["pixel_values"], enc["image_sizes"],
                                   vision_feature_layer=cfg.vision_feature_layer,
                                   vision_feature_select_strategy=cfg.vision_feature_select_strategy,
                                   batch_num_images=enc["batch_num_images"])
    return sum(t.shape[0] for t in out.pooler_output)


def _pixtral_features(model, enc):
    # Mistral 3: one [tokens, hidden] per image, (H / 16) x (W / 16) of its real size
    out = model.get_image_features(enc["pixel_values"], enc["image_sizes"])
    cell = model.config.vision_config.patch_size * model.config.spatial_merge_size
    assert [t.shape[0] for t in out.pooler_output] == [
        (h // cell) * (w // cell) for h, w in enc["image_sizes"].tolist()]
    return sum(t.shape[0] for t in out.pooler_output)


def _omni_features(model, enc):
    out = model.get_audio_features(enc["input_features"], enc["feature_attention_mask"])
    return out.last_hidden_state.shape[0]  # [audio tokens of all clips, text hidden]


SPECS = {
    "qwen3-vl": dict(
        processor="Qwen3VLProcessor", image_processor="Qwen2VLImageProcessor",
        model="Qwen3VLForConditionalGeneration", auto=True, media="image",
        marker="<|vision_start|><|image_pad|><|vision_end|>", token="<|image_pad|>",
        token_attr="image_token_id", features=_qwen3_vl_features, n_112=16),
    "qwen3-vl-moe": dict(
        processor="Qwen3VLProcessor", image_processor="Qwen2VLImageProcessor",
        model="Qwen3VLMoeForConditionalGeneration", auto=True, media="image",
        marker="<|vision_start|><|image_pad|><|vision_end|>", token="<|image_pad|>",
        token_attr="image_token_id", features=_qwen3_vl_features, n_112=16),
    # Gemma 3: the template writes <start_of_image>, the processor expands it; a batch's images
    # are nested per prompt ([[img], []]: the text-only prompt has none)
    "gemma3": dict(
        processor="Gemma3Processor", image_processor="Gemma3ImageProcessor",
        model="Gemma3ForConditionalGeneration", auto=True, media="image", nested=True,
        marker="<start_of_image>", token="<image_soft_token>", token_attr="image_token_index",
        features=_gemma3_features, n_112=16, type_ids="token_type_ids"),
    # the Qwen3-Omni thinker: 13 audio tokens per second (three stride-2 convs per 100-frame chunk)
    "qwen3-omni": dict(
        processor="Qwen3OmniMoeProcessor", model="Qwen3OmniMoeThinkerForConditionalGeneration",
        auto=True, media="audio", marker="<|audio_start|><|audio_pad|><|audio_end|>", token="<|audio_pad|>",
        token_attr="audio_token_id", features=_omni_features, n_1s=13, type_ids=None),
    # InternVL: <IMG_CONTEXT> in the template; a 112 px image is 2x2 tiles of 56 px + a thumbnail
    "internvl": dict(
        processor="InternVLProcessor", image_processor="GotOcr2ImageProcessor",
        model="InternVLForConditionalGeneration", auto=True, media="image", marker="<IMG_CONTEXT>",
        token="<IMG_CONTEXT>", token_attr="image_token_id", features=_tiles_features, n_112=20,
        type_ids=None),
    # Qwen3.5: Qwen3-VL's processor; Gated DeltaNet + full attention; the prompt opens <think>
    "qwen3.5": dict(
        processor="Qwen3VLProcessor", image_processor="Qwen2VLImageProcessor",
        model="Qwen3_5ForConditionalGeneration", auto=True, media="image",
        marker="<|vision_start|><|image_pad|><|vision_end|>", token="<|image_pad|>",
        token_attr="image_token_id", features=_qwen3_5_features, n_112=16),
    # Qwen3.5-MoE: the same processor and decoder pattern, every layer a sparse MoE block
    "qwen3.5-moe": dict(
        processor="Qwen3VLProcessor", image_processor="Qwen2VLImageProcessor",
        model="Qwen3_5MoeForConditionalGeneration", auto=True, media="image",
        marker="<|vision_start|><|image_pad|><|vision_end|>", token="<|image_pad|>",
        token_attr="image_token_id", features=_qwen3_5_features, n_112=16),
    # SmolVLM: <image> in the template; a 112 px image is 2x2 squares of 32 px + the global one
    "smolvlm": dict(
        processor="SmolVLMProcessor", image_processor="SmolVLMImageProcessor",
        model="SmolVLMForConditionalGeneration", auto=True, media="image", nested=True,
        marker="<image>", token="<image>", token_attr="image_token_id",
        features=_batch_rows_features, n_112=20, type_ids=None),
    # LLaVA-OneVision: <image> in the template; a lone 112 px image: a 2x2 grid of 16 px crops,
    # 4 rows of 4 + a newline each, after the 2x2 base crop (4 + 20 = 24)
    "llava-onevision": dict(
        processor="LlavaOnevisionProcessor", image_processor="LlavaOnevisionImageProcessor",
        model="LlavaOnevisionForConditionalGeneration", auto=True, media="image", nested=True,
        marker="<image>", token="<image>", token_attr="image_token_index",
        features=_anyres_features, n_112=24, type_ids=None),
    # Mistral 3: [IMG] in the template; a 112 px image fits the 64 px longest edge: 4 rows of 4
    # [IMG], each row closed by [IMG_BREAK] (the last by [IMG_END])
    "mistral3": dict(
        processor="PixtralProcessor", image_processor="PixtralImageProcessor",
        model="Mistral3ForConditionalGeneration", auto=True, media="image", marker="[IMG]",
        token="[IMG]", token_attr="image_token_index", features=_pixtral_features, n_112=16,
        type_ids=None),
    # GLM-4.1V: Qwen2-VL's geometry (a 112 px image: grid [1, 8, 8], 16 tokens) and
    # mm_token_type_ids; <|begin_of_image|><|image|><|end_of_image|> in the template
    "glm4v": dict(
        processor="Glm4vProcessor", image_processor="Glm4vImageProcessor",
        model="Glm4vForConditionalGeneration", auto=True, media="image",
        marker="<|begin_of_image|><|image|><|end_of_image|>", token="<|image|>",
        token_attr="image_token_id", features=_qwen3_5_features, n_112=16),
}
NEW_KINDS = tuple(SPECS)
QUESTION = "How many shapes?"


def _image(size: int = 112) -> Image.Image:
    img = Image.new("RGB", (size, size), (240, 240, 240))
    for x in range(size // 4, size // 2):
        for y in range(size // 4, size // 2):
            img.putpixel((x, y), (220, 20, 20))
    return img


def _clip(seconds: float = 1.0, rate: int = 16000):
    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 440 * t)).astype("float32")


@pytest.fixture(scope="module", params=NEW_KINDS)
def tiny(request, tmp_path_factory):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    kind = request.param
    spec = SPECS[kind]
    out = build_tiny(kind, tmp_path_factory.mktemp(kind.replace(".", "_")))
    processor = AutoProcessor.from_pretrained(out)
    if spec["auto"]:
        model = AutoModelForImageTextToText.from_pretrained(out)
    else:
        import json

        arch = json.loads((out / "config.json").read_text())["architectures"][0]
        model = getattr(transformers, arch).from_pretrained(out)
    return kind, spec, out, processor, model.eval()


def _user_turn(spec):
    if spec["media"] == "image":
        media = {"type": "image"}
    else:
        media = {"type": "audio", "audio": "a.wav"}
    return [{"role": "user", "content": [media, {"type": "text", "text": QUESTION}]}]


def _text_turn():
    return [{"role": "user", "content": [{"type": "text", "text": "Say yes or no."}]}]


def _encode(processor, spec):
    t1 = processor.apply_chat_template(_user_turn(spec), tokenize=False, add_generation_prompt=True)
    t2 = processor.apply_chat_template(_text_turn(), tokenize=False, add_generation_prompt=True)
    if spec["media"] == "image":
        images = [[_image()], []] if spec.get("nested") else [_image()]
        return processor(text=[t1, t2], images=images, padding=True, return_tensors="pt")
    return processor(text=[t1, t2], audio=[_clip()], padding=True, return_tensors="pt")


def test_kinds_are_registered():
    for kind in NEW_KINDS:
        assert kind in KINDS
        assert kind in (IMAGE_KINDS if SPECS[kind]["media"] == "image" else AUDIO_KINDS)
    from mmrlvr.cli import build_parser

    tiny_parser = build_parser()._subparsers._group_actions[0].choices["tiny"]
    kind_action = next(a for a in tiny_parser._actions if a.dest == "kind")
    assert set(KINDS) <= set(kind_action.choices)


def test_build_is_bit_reproducible(tiny, tmp_path):
    kind, _, out, _, _ = tiny
    again = build_tiny(kind, tmp_path / "again")
    for name in ("model.safetensors", "config.json", "tokenizer.json", "processor_config.json",
                 "chat_template.jinja", "tiny.json"):
        assert (out / name).read_bytes() == (again / name).read_bytes(), name
    from safetensors.torch import load_file

    assert all(t.dtype == torch.float32 for t in load_file(out / "model.safetensors").values())
    other = build_tiny(kind, tmp_path / "other", seed=1)
    assert (out / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


def test_real_classes_and_card(tiny):
    import json

    kind, spec, out, processor, model = tiny
    assert type(processor).__name__ == spec["processor"]
    assert type(model).__name__ == spec["model"]
    assert json.loads((out / "config.json").read_text())["architectures"] == [spec["model"]]
    if "image_processor" in spec:
        assert type(processor.image_processor).__name__ == spec["image_processor"]
    card = (out / "TINY.md").read_text()
    assert "random-weight" in card and kind in card
    assert json.loads((out / "tiny.json").read_text())["kind"] == kind
    tok = processor.tokenizer
    assert tok.padding_side == "left"
    assert getattr(model.config, spec["token_attr"]) == tok.convert_tokens_to_ids(spec["token"])
    assert model.get_input_embeddings().weight.shape[0] == len(tok)
    assert model.generation_config.max_new_tokens == 64
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 5_000_000


def test_chat_template_writes_one_placeholder_per_medium(tiny):
    _, spec, _, processor, _ = tiny
    prompt = processor.apply_chat_template(_user_turn(spec), tokenize=False, add_generation_prompt=True)
    assert prompt.count(spec["marker"]) == 1
    assert QUESTION in prompt
    text_only = processor.apply_chat_template(_text_turn(), tokenize=False, add_generation_prompt=True)
    assert spec["marker"] not in text_only


def test_padded_batch_features_generate_and_train(tiny):
    _, spec, _, processor, model = tiny
    enc = _encode(processor, spec)
    ids = enc["input_ids"]
    token_id = getattr(model.config, spec["token_attr"])
    # left padding: the text-only prompt is the shorter one and is padded on the left
    assert enc["attention_mask"][1, 0] == 0 and enc["attention_mask"][:, -1].all()
    n_tokens = [int(n) for n in (ids == token_id).sum(-1)]
    assert n_tokens[1] == 0 and n_tokens[0] > 0
    if "n_112" in spec:
        assert n_tokens[0] == spec["n_112"]
    if "n_1s" in spec:
        assert n_tokens[0] == spec["n_1s"]
    type_ids = spec.get("type_ids", "mm_token_type_ids")
    if type_ids:  # 1 on the media placeholders
        assert torch.equal(enc[type_ids].bool(), ids == token_id)
    with torch.no_grad():
        assert spec["features"](model, enc) == n_tokens[0]
        gen = model.generate(**enc, max_new_tokens=5, do_sample=True)
    assert gen.shape[0] == 2 and ids.shape[1] < gen.shape[1] <= ids.shape[1] + 5
    labels = ids.masked_fill(enc["attention_mask"] == 0, -100).masked_fill(ids == token_id, -100)
    model.zero_grad()
    out = model(**enc, labels=labels)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for p in model.get_input_embeddings().parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    model.zero_grad()


def test_qwen3_omni_audio_length_formula():
    """13 tokens a second: the processor and the model share one length function."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as modeling
    from transformers.models.qwen3_omni_moe import processing_qwen3_omni_moe as processing

    frames = torch.tensor([50, 100, 150, 200, 250, 300, 3000])  # mel frames: 100 a second
    expected = torch.tensor([7, 13, 20, 26, 33, 39, 390])
    assert torch.equal(processing._get_feat_extract_output_lengths(frames, 50), expected)
    assert torch.equal(modeling._get_feat_extract_output_lengths(frames, 50), expected)


def test_gemma3_tokenizer_adds_bos_like_gemma(tmp_path):
    """Like the real Gemma tokenizer (add_bos_token): text tokenized outside the chat template
    starts with <bos>; the template writes one too, so processor(text=templated) has two."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(build_tiny("gemma3", tmp_path / "g"))
    tok = processor.tokenizer
    assert tok("yes").input_ids[0] == tok.bos_token_id == tok.convert_tokens_to_ids("<bos>")
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "yes"}]}], tokenize=False,
        add_generation_prompt=True)
    assert prompt.startswith("<bos><start_of_turn>user\n") and prompt.endswith("<start_of_turn>model\n")
    assert processor(text=[prompt], return_tensors="pt").input_ids[0, :2].tolist() == [tok.bos_token_id] * 2
