"""Tiny real-architecture models: build, reload through the Auto classes, process, run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from PIL import Image  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer  # noqa: E402

from mmrlvr.tiny import VISION_KINDS, build_tiny  # noqa: E402
from mmrlvr.tiny.tokenizer import QWEN_SPECIAL_TOKENS, build_tokenizer  # noqa: E402

VISION_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"
MESSAGES = [{"role": "user", "content": [
    {"type": "image"}, {"type": "text", "text": "How many shapes are in the image?"}]}]


@pytest.fixture(scope="module", params=VISION_KINDS)
def tiny(request, tmp_path_factory):
    kind = request.param
    out = build_tiny(kind, tmp_path_factory.mktemp(kind.replace(".", "_")))
    processor = AutoProcessor.from_pretrained(out)
    model = AutoModelForImageTextToText.from_pretrained(out).eval()
    return kind, out, processor, model


def _img(size: int, colour=(220, 20, 20)) -> Image.Image:
    return Image.new("RGB", (size, size), colour)


def test_reload_real_classes(tiny):
    kind, out, processor, model = tiny
    expected = {"qwen2-vl": ("Qwen2VLProcessor", "Qwen2VLForConditionalGeneration"),
                "qwen2.5-vl": ("Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration")}[kind]
    assert (type(processor).__name__, type(model).__name__) == expected
    assert type(processor.image_processor).__name__.startswith("Qwen2VLImageProcessor")
    assert (out / "TINY.md").read_text().count("random") >= 1
    assert model.dtype == torch.float32
    assert model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_size_and_vocab(tiny):
    _, _, processor, model = tiny
    n = sum(p.numel() for p in model.parameters())
    assert 100_000 < n < 2_000_000
    tok = processor.tokenizer
    assert model.config.text_config.vocab_size == len(tok) == model.get_input_embeddings().weight.shape[0]
    ids = {t: tok.convert_tokens_to_ids(t) for t in
           ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_end|>", "<|endoftext|>")}
    cfg = model.config
    assert (cfg.image_token_id, cfg.video_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id) == (
        ids["<|image_pad|>"], ids["<|video_pad|>"], ids["<|vision_start|>"], ids["<|vision_end|>"])
    assert model.generation_config.eos_token_id == ids["<|im_end|>"]
    assert model.generation_config.pad_token_id == ids["<|endoftext|>"]


def test_tokenizer(tiny):
    _, out, processor, _ = tiny
    for tok in (processor.tokenizer, AutoTokenizer.from_pretrained(out)):
        assert tok.padding_side == "left"
        assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
        assert tok.chat_template and VISION_BLOCK in tok.chat_template
        for text in ["Is the red circle on the left or the right? There are 2 red circles. 2 + 1 = 3.",
                     "<think>How many more circles than squares?</think><answer>12</answer>",
                     "Ünïcode ✓ and 日本語 still round-trip\n\twith  spaces "]:
            assert tok.decode(tok(text).input_ids) == text
        for special in QWEN_SPECIAL_TOKENS:
            ids = tok(f"a{special}b", add_special_tokens=False).input_ids
            assert len(tok(special, add_special_tokens=False).input_ids) == 1, special
            assert tok.convert_tokens_to_ids(special) in ids, special
        # digits are split one per token
        assert tok.convert_ids_to_tokens(tok("12345", add_special_tokens=False).input_ids) == list("12345")
        # task words are single tokens (BPE learned the corpus)
        assert len(tok(" circles", add_special_tokens=False).input_ids) == 1
        batch = tok(["yes", "How many shapes are in the image?"], padding=True, return_tensors="pt")
        assert batch.input_ids[0, 0] == tok.pad_token_id and batch.attention_mask[0, 0] == 0


def test_chat_template(tiny):
    _, _, processor, _ = tiny
    prompt = processor.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt == ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                      f"{VISION_BLOCK}How many shapes are in the image?<|im_end|>\n<|im_start|>assistant\n")


def test_image_expansion_forward_generate(tiny):
    _, _, processor, model = tiny
    prompt = processor.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    image_id = model.config.image_token_id
    for size, n_tokens in ((56, 4), (112, 16)):
        enc = processor(text=[prompt], images=[_img(size)], return_tensors="pt")
        assert int((enc.input_ids == image_id).sum()) == n_tokens
        assert int(enc.image_grid_thw.prod()) == 4 * n_tokens == enc.pixel_values.shape[0]
        assert torch.equal(enc.mm_token_type_ids.bool(), enc.input_ids == image_id)

    # a padded batch of two: left padding, forward, greedy generate twice -> same tokens
    enc = processor(text=[prompt, "<|im_start|>user\nHi " + prompt], images=[_img(56), _img(56, (20, 60, 220))],
                    return_tensors="pt", padding=True)
    assert enc.attention_mask[0, 0] == 0 and enc.attention_mask[1].all()
    with torch.no_grad():
        logits = model(**enc).logits
        assert logits.shape == (*enc.input_ids.shape, len(processor.tokenizer))
        assert torch.isfinite(logits).all()
        g1 = model.generate(**enc, max_new_tokens=4, do_sample=False)
        g2 = model.generate(**enc, max_new_tokens=4, do_sample=False)
    assert g1.shape[1] <= enc.input_ids.shape[1] + 4
    assert torch.equal(g1, g2)


def test_training_step_has_grads(tiny):
    _, _, processor, model = tiny
    prompt = processor.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[prompt + "<answer>3</answer><|im_end|>"] * 2, images=[_img(56)] * 2, return_tensors="pt")
    model.zero_grad()
    out = model(**enc, labels=enc.input_ids)
    out.loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "visual" in n or "vision" in n]
    assert grads and all(g is not None for g in grads)  # the image path is in the graph
    model.zero_grad()


def test_build_is_deterministic(tmp_path):
    a = build_tiny("qwen2-vl", tmp_path / "a", seed=3)
    b = build_tiny("qwen2-vl", tmp_path / "b", seed=3)
    c = build_tiny("qwen2-vl", tmp_path / "c", seed=4)
    wa, wb, wc = (load_file(d / "model.safetensors") for d in (a, b, c))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    for name in ("tokenizer.json", "config.json", "processor_config.json", "chat_template.jinja"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_build_tokenizer_reusable(tmp_path):
    tok = build_tokenizer(tmp_path, extra_corpus=["a dog barks at the cat"] * 5, vocab_target=620,
                          special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>"))
    assert len(tok) == 620
    assert len(tok(" dog", add_special_tokens=False).input_ids) == 1
    assert len(tok("<|AUDIO|>", add_special_tokens=False).input_ids) == 1
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert len(again) == 620 and again.padding_side == "left"
    with pytest.raises(ValueError):
        build_tokenizer(None, vocab_target=260)
    with pytest.raises(ValueError):
        build_tiny("llava", tmp_path / "x")


def test_cli_sizes_the_vision_tower(tmp_path):
    import json

    from mmrlvr.cli import main
    assert main(["tiny", "qwen2.5-vl", "--out", str(tmp_path / "m"), "--vision-depth", "3",
                 "--vision-width", "96"]) == 0
    vision = json.loads((tmp_path / "m" / "config.json").read_text())["vision_config"]
    assert (vision["depth"], vision["hidden_size"], vision["fullatt_block_indexes"]) == (3, 96, [2])
    with pytest.raises(ValueError, match="multiple of 16"):
        main(["tiny", "qwen2.5-vl", "--out", str(tmp_path / "n"), "--vision-width", "100"])


def test_tiny_models_carry_their_own_small_pixel_bounds_and_budget(tiny, tmp_path):
    """What a config leaving model.min_pixels/max_pixels and rollout.max_new_tokens at 0 runs
    with on a tiny model: the bounds its processor was built with and 64 tokens."""
    import json

    from mmrlvr.config import model_defaults

    _, out, processor, model = tiny
    assert json.loads((out / "generation_config.json").read_text())["max_new_tokens"] == 64
    assert model.generation_config.max_new_tokens == 64
    size = processor.image_processor.size
    assert (size["shortest_edge"], size["longest_edge"]) == (56 * 56, 112 * 112)
    found = model_defaults(str(out))
    assert (found.min_pixels, found.max_pixels, found.max_new_tokens) == (3136, 12544, 64)


def test_tiny_pixel_bounds_follow_the_build_and_audio_models_carry_the_budget(tmp_path):
    import json

    from mmrlvr.config import model_defaults

    small = build_tiny("qwen2-vl", tmp_path / "small", min_pixels=28 * 28, max_pixels=56 * 56)
    assert (model_defaults(str(small)).min_pixels, model_defaults(str(small)).max_pixels) == \
        (784, 3136)
    audio = build_tiny("qwen2-audio", tmp_path / "audio")
    assert json.loads((audio / "generation_config.json").read_text())["max_new_tokens"] == 64
