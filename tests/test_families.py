"""Every model family (`mmrlvr.models`) on a tiny random model of its real class: padding
invariance, the rollout-vs-trainer logprob gap (the M-RoPE bug class), shared-prompt logprobs,
two GRPO steps with eval and a checkpoint, resume, LoRA and `mmrlvr eval`; an unsupported model
is refused before its weights load, and a processor that does not match its model is named."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

import modalities
from mmrlvr import models
from mmrlvr.config import ModelConfig, load_config
from mmrlvr.core.types import select
from mmrlvr.data import Example
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.tiny import KINDS
from mmrlvr.train.logger import read_metrics
from mmrlvr.train.policy import Policy, PolicyError
from mmrlvr.train.trainer import train

VISION = [f.tiny for f in models.FAMILIES if f.modality == "vision" and f.tiny in KINDS]
AUDIO = [f.tiny for f in models.FAMILIES if f.modality == "audio" and f.tiny in KINDS]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A text-only row, one image, two images of other sizes."""
    root = tmp_path_factory.mktemp("family-images")
    paths = []
    for name, size, colour in (("a", 56, (220, 20, 20)), ("b", 112, (20, 60, 220))):
        Image.new("RGB", (size, size), colour).save(root / f"{name}.png")
        paths.append(str(root / f"{name}.png"))
    a, b = paths
    return [Example(id="none", prompt="What is 2 + 3?", answer="5"),
            Example(id="one", prompt="What colour is the shape?", answer="red", images=[a]),
            Example(id="two", prompt="How many shapes are in these two pictures?", answer="2",
                    images=[b, a])]


def _policy(path: Path, modality: str = "vision") -> Policy:
    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(path), modality=modality), modalities.get(modality),
                       torch.device("cpu"))


def _completions(policy, widths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, len(policy.tokenizer) - 40, (len(widths), max(widths)), generator=gen)
    mask = torch.zeros_like(ids)
    for i, w in enumerate(widths):
        mask[i, :w] = 1
    return torch.where(mask.bool(), ids, torch.full_like(ids, policy.pad_id)), mask


def assert_padding_invariant(policy, examples, ids, mask) -> None:
    """Each row's logprobs in the padded batch of `examples` equal its own alone."""
    batch = policy.adapter.encode(examples, policy.processor)
    with torch.no_grad():
        together, _ = policy.completion_logprobs(select(batch, list(range(len(examples))))[0],
                                                 ids, mask)
        for i, ex in enumerate(examples):
            w = int(mask[i].sum())
            alone, _ = policy.completion_logprobs(
                policy.adapter.encode([ex], policy.processor).inputs, ids[i:i + 1, :w],
                mask[i:i + 1, :w])
            torch.testing.assert_close(together[i, :w], alone[0], atol=2e-5, rtol=1e-4)


def assert_rollout_matches_trainer(policy, batch, n: int, max_new_tokens: int) -> None:
    """What the engine sampled with equals what the training forward recomputes (fp32, CPU),
    row by row and with the media features shared per prompt."""
    torch.manual_seed(2)
    roll = make_engine("hf", policy).generate(batch, SamplingParams(
        n=n, max_new_tokens=max_new_tokens, temperature=1.0))
    rows = [i for i in range(len(batch)) for _ in range(n)]
    with torch.no_grad():
        logp, _ = policy.rollout_logprobs(batch, rows, roll.completion_ids, roll.completion_mask)
        whole, _ = policy.completion_logprobs(select(batch, rows)[0], roll.completion_ids,
                                              roll.completion_mask,
                                              media=policy.shared_media(batch, rows))
    m = roll.completion_mask.bool()
    assert m.sum() > 0
    assert (logp - roll.sample_logprobs)[m].abs().max() < 1e-4
    assert (whole - roll.sample_logprobs)[m].abs().max() < 1e-4


@pytest.mark.parametrize("kind", VISION)
def test_padded_mixed_batch_logprobs_equal_each_row_alone(kind, tiny_dirs, mixed):
    policy = _policy(tiny_dirs(kind))
    assert models.of_model(policy.model).tiny == kind
    assert_padding_invariant(policy, mixed, *_completions(policy, [5, 9, 2]))


@pytest.mark.parametrize("kind", VISION)
def test_rollout_and_trainer_logprobs_agree(kind, tiny_dirs, mixed):
    """Positions, media features and masks are the same in the engine and the trainer."""
    policy = _policy(tiny_dirs(kind))
    assert_rollout_matches_trainer(policy, policy.adapter.encode(mixed, policy.processor), 3, 10)


def _run_config(tmp_path: Path, model: Path, data: Path, name: str, **train_extra) -> Path:
    cfg = {"model": {"path": str(model)},
           "data": {"train": str(data / "train.jsonl"), "eval": str(data / "test.jsonl"),
                    "eval_limit": 2},
           "rollout": {"group_size": 2, "max_new_tokens": 4, "temperature": 1.0},
           "optim": {"lr": 1e-3},
           "train": {"steps": 2, "batch_prompts": 2, "micro_batch": 4, "save_every": 2,
                     "eval_every": 2, "out_dir": str(tmp_path / name), "seed": 1, **train_extra},
           "rewards": [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1},
                       {"name": str(tmp_path / "len.py") + ":length", "weight": 0.5}]}
    (tmp_path / "len.py").write_text(
        "def length(example, completion):\n    return min(len(completion), 20) / 20.0\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def tones_dir(tmp_path_factory):
    from mmrlvr.tasks.tones import make_tones

    out = tmp_path_factory.mktemp("tones")
    make_tones(out, n_train=16, n_test=4, seed=0)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", VISION + AUDIO)
def test_two_grpo_steps_eval_checkpoint_resume_and_lora(kind, tiny_dirs, shapes_dir, tones_dir,
                                                       tmp_path):
    family = models.get(kind)
    data = tones_dir if family.modality == "audio" else shapes_dir
    path = _run_config(tmp_path, tiny_dirs(kind), data, "run")
    overrides = [f"model.modality={family.modality}"]
    summary = train(load_config(path, overrides), progress=False)
    assert summary["accuracy_start"] is not None and summary["steps"] == 2
    assert (tmp_path / "run" / "checkpoints" / "step-2" / "COMPLETE").is_file()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    train(load_config(tmp_path / "run" / "config.yaml", ["train.steps=3"]), resume=True,
          progress=False)
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [0, 1, 2, 3]
    lora = load_config(_run_config(tmp_path, tiny_dirs(kind), data, "lora", steps=1, save_every=1,
                                   eval_every=0), overrides + ["model.lora.r=4", "data.eval="])
    train(lora, progress=False)
    assert (tmp_path / "lora" / "final" / "adapter").is_dir()

    from mmrlvr.cli import main

    assert main(["eval", "--model", str(tmp_path / "run" / "final"), "--data",
                 str(data / "test.jsonl"), "--modality", family.modality, "--limit", "2",
                 "--max-new-tokens", "4"]) == 0


def test_an_unsupported_model_is_refused_before_its_weights_load(tmp_path, tiny_vl):
    for f in Path(tiny_vl).iterdir():
        if f.name != "model.safetensors":        # no weights at all: nothing may try to read them
            (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "paligemma"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PolicyError, match=r"model_type 'paligemma' is not a family mmrlvr "
                                          r"trains\. Supported: qwen2-vl \(qwen2_vl\); .*gemma3"):
        _policy(tmp_path)


def test_a_processor_that_does_not_match_its_model_is_named(tmp_path, tiny_dirs):
    """A Qwen3-VL model dir holding Qwen2.5-VL's processor (14-pixel patches for a 16-pixel
    tower): one error naming both, before the first step."""
    if "qwen3-vl" not in VISION:
        pytest.skip("no tiny qwen3-vl")
    q3, q25 = tiny_dirs("qwen3-vl"), tiny_dirs("qwen2.5-vl")
    for f in q3.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    for name in ("processor_config.json", "preprocessor_config.json"):
        if (q25 / name).is_file():
            (tmp_path / name).write_bytes((q25 / name).read_bytes())
    with pytest.raises(PolicyError, match=r"14-pixel patches, the qwen3-vl model's vision tower "
                                          r"takes 16-pixel ones"):
        _policy(tmp_path)


def test_a_vision_family_is_not_fed_by_the_audio_modality(tiny_vl):
    with pytest.raises(PolicyError, match="qwen2.5-vl model, fed by the vision modality, not audio"):
        _policy(tiny_vl, "audio")


def test_lora_auto_takes_the_family_targets(tiny_dirs):
    """`model.lora.target_modules: [auto]`: Qwen3.5's linear-attention projections get adapters
    beside the attention ones; a plain Qwen-VL gets its q/k/v/o."""
    from mmrlvr.config import LoraConfig

    for kind, extra in (("qwen3.5", {"in_proj_qkv", "in_proj_z", "out_proj"}), ("qwen2.5-vl", set())):
        cfg = ModelConfig(path=str(tiny_dirs(kind)), lora=LoraConfig(r=4, target_modules=["auto"]))
        policy = Policy.load(cfg, modalities.get("vision"), torch.device("cpu"))
        adapted = {n.split(".lora_A")[0].rsplit(".", 1)[-1]
                   for n, _ in policy.model.named_parameters() if ".lora_A." in n}
        assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj"} | extra


def _by_hand(kind: str, src: Path, out: Path) -> Path:
    """A model of `kind`'s class built with transformers alone (its own config defaults, other
    sizes than `mmrlvr tiny`'s), saved with the tiny dir's processor: what a user who made a
    checkpoint elsewhere brings."""
    import transformers

    processor = transformers.AutoProcessor.from_pretrained(src)
    tok = processor.tokenizer
    ids = lambda t: tok.convert_tokens_to_ids(t)  # noqa: E731
    if kind == "qwen3-vl":
        config = transformers.Qwen3VLConfig(
            text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96,
                             num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                           "mrope_section": [6, 5, 5],
                                                           "mrope_interleaved": True}),
            vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                               out_hidden_size=64, patch_size=16, spatial_merge_size=2,
                               deepstack_visual_indexes=[0, 1]),
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
        model = transformers.Qwen3VLForConditionalGeneration(config)
    else:
        vision = processor.image_processor.size["height"]
        config = transformers.Gemma3Config(
            text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=96,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                             head_dim=32, sliding_window=64),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=2, image_size=vision, patch_size=8),
            mm_tokens_per_image=processor.image_seq_length, image_token_index=ids("<image_soft_token>"),
            boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"))
        model = transformers.Gemma3ForConditionalGeneration(config)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3-vl", "gemma3"])
def test_a_model_built_by_hand_with_transformers_trains(kind, tiny_dirs, shapes_dir, tmp_path):
    model = _by_hand(kind, tiny_dirs(kind), tmp_path / "by-hand")
    summary = train(load_config(_run_config(tmp_path, model, shapes_dir, "run")), progress=False)
    assert summary["steps"] == 2 and (tmp_path / "run" / "final" / "config.json").is_file()


def test_an_image_below_the_minimum_is_resized_up_with_a_counted_warning(tiny_dirs, tmp_path):
    policy = _policy(tiny_dirs("qwen3-vl"))
    Image.new("RGB", (20, 12), (0, 200, 0)).save(tmp_path / "small.png")
    rows = [Example(id=f"small-{i}", prompt="Colour?", answer="green",
                    images=[str(tmp_path / "small.png")]) for i in range(2)]
    with pytest.warns(UserWarning, match=r"sample small-0: image 20x12 px is below the model's "
                                         r"minimum of \d+ pixels"):
        batch = policy.adapter.encode(rows, policy.processor)
    assert policy.adapter.upscaled == 1                 # the same file, resized once (cached)
    grid = batch.inputs["image_grid_thw"]
    assert int(grid[0].prod()) * 16 * 16 >= policy.adapter.min_pixels   # 16-pixel patches


@pytest.mark.slow
def test_gspo_trains_a_moe_family(tiny_dirs, shapes_dir, tmp_path):
    """`algo.ratio: sequence` (GSPO, the MoE recipes' choice) end to end on the tiny Qwen3-VL-MoE,
    with 2 PPO epochs so the second sees ratios away from 1."""
    path = _run_config(tmp_path, tiny_dirs("qwen3-vl-moe"), shapes_dir, "gspo")
    cfg = load_config(path, ["algo.ratio=sequence", "algo.loss_agg=seq", "algo.ppo_epochs=2",
                             "algo.clip_low=3e-4", "algo.clip_high=4e-4", "data.eval="])
    train(cfg, progress=False)
    rows = read_metrics(tmp_path / "gspo" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(torch.isfinite(torch.tensor(r["loss/policy"])) for r in rows)


def _grad_names(policy, loss) -> set[str]:
    policy.model.zero_grad(set_to_none=True)
    loss.backward()
    return {n for n, p in policy.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", VISION + AUDIO)
def test_tower_zero_reaches_what_real_media_reach_and_counts_nothing(kind, tiny_dirs, mixed,
                                                                   tones_dir):
    """What FSDP2 runs on a rank without media (`Family.tower_zero`): exactly 0, with a gradient
    (of zeros) on every tower weight that real media give a gradient, so the tower units'
    reduce-scatters match the ranks that had media."""
    from mmrlvr.data import load_dataset

    family = models.get(kind)
    policy = _policy(tiny_dirs(kind), family.modality)
    cpu = torch.device("cpu")
    if family.modality == "audio":
        batch = policy.adapter.encode(load_dataset(str(tones_dir / "test.jsonl"))[:1], policy.processor)
        real = sum(c.sum() for c in family.encode_audio(
            policy.model, batch.inputs["input_features"], batch.inputs["feature_attention_mask"]))
    else:
        batch = policy.adapter.encode(mixed[1:2], policy.processor)
        out = family.encode_images(policy.model, batch.inputs, cpu, policy.dtype)
        parts = list(out.pooler_output)
        for layer in getattr(out, "deepstack_features", None) or ():
            parts.extend(layer)
        real = sum(p.sum() for p in parts)
    reached = _grad_names(policy, real)
    zero = family.tower_zero(policy.model, cpu)
    assert float(zero) == 0.0
    assert _grad_names(policy, zero) == reached and reached
    assert all(float(p.grad.abs().max()) == 0.0 for n, p in policy.model.named_parameters()
               if n in reached)


@pytest.mark.parametrize("kind", AUDIO)
def test_several_clips_per_prompt_sample_what_the_trainer_scores(kind, tiny_dirs, tmp_path):
    """Two clips in one prompt beside a one-clip and a text-only prompt: the rollout's logprobs
    equal the trainer's (the Omni thinkers place audio by time: positions come from the batch),
    and the padded batch gives each row's logprobs alone."""
    import numpy as np
    import soundfile as sf

    sr = 16000
    for i, freq in enumerate((440, 880, 660)):
        t = np.arange(int(sr * (0.6 + 0.3 * i))) / sr
        sf.write(tmp_path / f"c{i}.wav", 0.4 * np.sin(2 * np.pi * freq * t), sr)
    rows = [Example(id="two", prompt="Which clip is higher?", answer="2",
                    audios=[str(tmp_path / "c0.wav"), str(tmp_path / "c1.wav")]),
            Example(id="one", prompt="Is it loud?", answer="no", audios=[str(tmp_path / "c2.wav")]),
            Example(id="text", prompt="What is 2 + 2?", answer="4")]
    policy = _policy(tiny_dirs(kind), "audio")
    batch = policy.adapter.encode(rows, policy.processor)
    torch.manual_seed(0)
    roll = make_engine("hf", policy).generate(batch, SamplingParams(n=3, max_new_tokens=8,
                                                                    temperature=1.0))
    index = [i for i in range(3) for _ in range(3)]
    with torch.no_grad():
        logp, _ = policy.rollout_logprobs(batch, index, roll.completion_ids, roll.completion_mask)
        m = roll.completion_mask.bool()
        assert (logp - roll.sample_logprobs)[m].abs().max() < 1e-4
        ids, mask = _completions(policy, [5, 7, 3])
        together, _ = policy.completion_logprobs(select(batch, [0, 1, 2])[0], ids, mask,
                                                 media=policy.shared_media(batch, [0, 1, 2]))
        for i, ex in enumerate(rows):
            w = int(mask[i].sum())
            alone_batch = policy.adapter.encode([ex], policy.processor)
            alone, _ = policy.completion_logprobs(alone_batch.inputs, ids[i:i + 1, :w],
                                                  mask[i:i + 1, :w],
                                                  media=policy.shared_media(alone_batch, [0]))
            torch.testing.assert_close(together[i, :w], alone[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", [k for k in VISION if k not in ("qwen2-vl", "qwen2.5-vl")])
def test_the_demo_loads_and_answers_with_each_new_vision_family(kind, tiny_dirs, mixed):
    """`mmrlvr demo --model DIR` on each family: the launcher reads its modality off the family,
    and the Vision QA handler answers an image question to the end (Qwen2/2.5-VL: test_apps.py
    through a real server)."""
    from apps import vision_tab
    from apps.launcher import load_context

    ctx = load_context(str(tiny_dirs(kind)), device="cpu")
    assert ctx.policy.family.name == kind
    updates = list(vision_tab.answer(ctx, [mixed[1].images[0]], "How many shapes?",
                                     max_new_tokens=4, compare=False))
    assert updates[-1][-1].startswith("✓ done"), updates[-1][-1]
