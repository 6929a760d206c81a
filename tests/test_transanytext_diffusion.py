"""TransAnyText's diffusion stage (mmrlvr/methods/transanytext/diffusion.py) on tiny random
Stable Diffusion pipelines built from config and saved locally: no download, CPU, real PNG files."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from mmrlvr.methods.transanytext.diffusion import DiffusionStage, choose, glyph_mask, work_size
from mmrlvr.patches.render import erase, render_layer, render_patch, text_mask
from mmrlvr.patches.schema import Patch, TextBox
from mmrlvr.translate import compose, output_paths

pytest.importorskip("diffusers", reason="the diffusion stage needs diffusers")

BG = (88, 160, 214)
SOURCE = Patch([TextBox("Summer Sale", 10, 10, 200, 36, 24, weight=700, color=(255, 255, 255),
                        align="center")], 224, 112)
TARGET = Patch([TextBox("Soldes d'ete", 10, 60, 200, 36, 24, weight=700, color=(250, 240, 20),
                        align="center")], 224, 112)


def tiny_sd_pipeline(out, in_channels: int):
    """A random-weight Stable Diffusion pipeline saved to `out`: a plain text-to-image one
    (UNet in 4 channels, which diffusers inpaints by latent blending) or an inpainting one (9)."""
    import torch
    from diffusers import (AutoencoderKL, DDIMScheduler, StableDiffusionInpaintPipeline,
                           StableDiffusionPipeline, UNet2DConditionModel)
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=in_channels,
        out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
        norm_num_groups=8, attention_head_dim=4)
    vae = AutoencoderKL(block_out_channels=(32, 64), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, latent_channels=4,
                        norm_num_groups=8, sample_size=32)
    text = CLIPTextModel(CLIPTextConfig(bos_token_id=0, eos_token_id=2, pad_token_id=1,
                                        hidden_size=32, intermediate_size=37, num_attention_heads=4,
                                        num_hidden_layers=2, vocab_size=100))
    vocab = {"<|startoftext|>": 0, "!": 1, "<|endoftext|>": 2}
    for c in "abcdefghijklmnopqrstuvwxyz":
        vocab[c], vocab[c + "</w>"] = len(vocab), len(vocab) + 1
    (out / "tok").mkdir(parents=True)
    (out / "tok" / "vocab.json").write_text(json.dumps(vocab))
    (out / "tok" / "merges.txt").write_text("#version: 0.2\n")
    tok = CLIPTokenizer(str(out / "tok" / "vocab.json"), str(out / "tok" / "merges.txt"),
                        model_max_length=16)
    cls = StableDiffusionInpaintPipeline if in_channels == 9 else StableDiffusionPipeline
    cls(unet=unet, vae=vae, text_encoder=text, tokenizer=tok, scheduler=DDIMScheduler(steps_offset=1, clip_sample=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False).save_pretrained(out)
    return out


@pytest.fixture(scope="module", autouse=True)
def few_threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=[4, 9], ids=["sd-unet4", "inpaint-unet9"])
def pipeline_dir(request, tmp_path_factory):
    return tiny_sd_pipeline(tmp_path_factory.mktemp(f"sd{request.param}"), request.param)


@pytest.fixture(scope="module")
def banner_file(tmp_path_factory):
    """The source banner as a PNG on disk, read back (what `mmrlvr translate` gets)."""
    path = tmp_path_factory.mktemp("banner") / "in.png"
    render_patch(SOURCE, Image.new("RGB", (224, 112), BG)).save(path)
    return path


def test_auto_takes_diffusers_on_cuda_with_a_pipeline_and_opencv_otherwise():
    on_gpu = choose("auto", "auto", "pipe", cuda=True)
    assert (on_gpu.eraser, on_gpu.refine) == ("diffusers", True)
    for model_dir, cuda, why in [("pipe", False, "no CUDA"), (None, True, "no diffusers pipeline")]:
        cpu = choose("auto", "auto", model_dir, cuda=cuda)
        assert (cpu.eraser, cpu.refine) == ("opencv", False) and why in cpu.why
    assert choose("diffusers", "off", "pipe", cuda=True).refine is False
    assert choose("opencv", "auto", "pipe", cuda=True).eraser == "opencv"
    with pytest.raises(ValueError, match="--inpaint-model"):
        choose("diffusers", "auto", None)
    with pytest.raises(ValueError, match="refine 'on' needs the diffusers eraser"):
        choose("opencv", "on", "pipe", cuda=True)
    with pytest.raises(ValueError, match="eraser must be one of"):
        choose("lama")


def test_a_missing_or_invalid_pipeline_dir_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"pipeline dir {missing} does not exist"):
        DiffusionStage(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=f"{tmp_path / 'empty'} is not a diffusers pipeline dir"):
        DiffusionStage(tmp_path / "empty")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model_index.json").write_text(json.dumps(
        {"_class_name": "StableDiffusionInpaintPipeline", "unet": ["diffusers", "UNet2DConditionModel"]}))
    with pytest.raises(ValueError, match=f"could not load the inpainting pipeline in {broken}"):
        DiffusionStage(broken)
    with pytest.raises(ValueError, match="no denoising step"):
        DiffusionStage(missing, steps=2, refine_strength=0.3)      # checked before loading


def test_work_size_scales_the_longer_side_to_multiples_of_eight():
    assert work_size(200, 36, 512) == (512, 96)
    assert work_size(36, 200, 64) == (8, 64)           # 11.5 px: nearer 8 than 16
    assert work_size(3, 3, 8) == (8, 8)


def test_erase_and_refine_change_only_their_masks_and_repeat_exactly(pipeline_dir, banner_file):
    image = Image.open(banner_file).convert("RGB")
    stage = DiffusionStage(pipeline_dir, steps=4, size=64, refine_strength=0.5)
    mask = text_mask(image, SOURCE.boxes)
    erased, layer, final = compose(image, TARGET, erase_boxes=SOURCE, method="diffusers",
                                   inpainter=stage)
    src, out = np.asarray(image), np.asarray(erased)
    keep = mask == 0
    assert np.array_equal(out[keep], src[keep])                  # outside the ink: exact
    assert not np.array_equal(out[~keep], src[~keep])            # the ink was replaced
    assert np.array_equal(np.asarray(erase(image, mask, method="diffusers", inpainter=stage)), out)

    refined = np.asarray(stage.refine(final, layer))
    glyphs = glyph_mask(layer, stage.grow) > 0
    assert glyphs.sum() > (np.asarray(layer)[:, :, 3] > 0).sum()  # grown past the drawn pixels
    assert np.array_equal(refined[~glyphs], np.asarray(final)[~glyphs])
    assert not np.array_equal(refined[glyphs], np.asarray(final)[glyphs])
    assert stage.seconds["erase"] > 0 and stage.seconds["refine"] > 0
    # a lower strength keeps the rendered text closer (same seed, same noise)
    gentle = DiffusionStage(pipeline_dir, steps=4, size=64, refine_strength=0.25)
    soft = np.asarray(gentle.refine(final, layer)).astype(int)
    drawn = np.asarray(final).astype(int)
    assert np.abs(soft - drawn)[glyphs].mean() < np.abs(refined.astype(int) - drawn)[glyphs].mean()


def test_an_empty_mask_leaves_the_image_as_it_was(pipeline_dir, banner_file):
    image = Image.open(banner_file).convert("RGB")
    stage = DiffusionStage(pipeline_dir, steps=2, size=32, refine_strength=0.5)
    assert np.array_equal(np.asarray(stage(image, np.zeros((112, 224), np.uint8))), np.asarray(image))
    empty = render_layer(Patch([], 224, 112), (224, 112))
    assert np.array_equal(np.asarray(stage.refine(image, empty)), np.asarray(image))


def test_translate_erases_with_the_pipeline_end_to_end(tmp_path, tiny_vl, pipeline_dir,
                                                       banner_file, capsys):
    from mmrlvr.cli import main

    (tmp_path / "src.html").write_text(
        '<div style="left:10px;top:10px;width:200px;height:36px;font-size:24px;'
        'font-weight:700;color:#ffffff;text-align:center">Summer Sale</div>')
    out = tmp_path / "out" / "fr.png"
    args = ["translate", "--model", str(tiny_vl), "--image", str(banner_file), "--lang", "fr",
            "--max-new-tokens", "4", "--device", "cpu", "--source-patch", str(tmp_path / "src.html")]
    assert main(args + ["--out", str(out), "--eraser", "diffusers", "--inpaint-model",
                        str(pipeline_dir), "--inpaint-steps", "4"]) == 0
    result = json.loads(output_paths(out)["json"].read_text())
    assert result["diffusion"] == {"eraser": "diffusers", "refine": True, "why": "asked for diffusers"}
    assert result["seconds"]["erase"] > 0
    assert result["seconds"]["refine"] == 0.0 and "rendered" not in result["files"]  # no patch drawn
    source = np.asarray(Image.open(banner_file).convert("RGB"))
    mask = text_mask(Image.open(banner_file), SOURCE.boxes)
    erased = np.asarray(Image.open(output_paths(out)["erased"]))
    assert np.array_equal(erased[mask == 0], source[mask == 0])
    assert not np.array_equal(erased[mask > 0], source[mask > 0])

    missing = tmp_path / "no-pipe"
    assert main(args + ["--out", str(tmp_path / "x.png"), "--eraser", "diffusers",
                        "--inpaint-model", str(missing)]) == 2
    assert f"pipeline dir {missing} does not exist" in capsys.readouterr().err


def test_opencv_on_cpu_is_the_plain_path_bit_for_bit(tmp_path, tiny_vl, banner_file):
    """`--eraser auto` on a CPU machine, even given a pipeline dir, is the OpenCV path: the same
    pixels as erasing with OpenCV by hand, and no refinement."""
    from mmrlvr.translate import translate

    (tmp_path / "src.html").write_text(
        '<div style="left:10px;top:10px;width:200px;height:36px;font-size:24px;'
        'font-weight:700;color:#ffffff;text-align:center">Summer Sale</div>')
    result = translate(str(tiny_vl), banner_file, "fr", tmp_path / "fr.png",
                       source_patch=tmp_path / "src.html", inpaint_model=str(tmp_path / "unused"),
                       max_new_tokens=4, device="cpu")
    assert result["diffusion"] == {"eraser": "opencv", "refine": False, "why": "auto: no CUDA device"}
    image = Image.open(banner_file).convert("RGB")
    by_hand = erase(image, text_mask(image, SOURCE.boxes), method="opencv")
    paths = output_paths(tmp_path / "fr.png")
    assert np.array_equal(np.asarray(Image.open(paths["erased"])), np.asarray(by_hand))
    assert np.array_equal(np.asarray(Image.open(paths["final"])), np.asarray(by_hand))  # no patch
    assert not paths["rendered"].exists()
