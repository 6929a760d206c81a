"""`mmrlvr plan`: exact parameter counts off the meta device, the memory arithmetic, verdicts."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmrlvr.config import ConfigError, load_config
from mmrlvr import models
from mmrlvr.train.plan import BUILTIN, GiB, make_plan, prompt_tokens

ROOT = Path(__file__).parent.parent
RECIPES_7B = sorted((ROOT / "configs").glob("*7b*.yaml"))


def _cfg(path, *overrides):
    return load_config(None, [f"model.path={path}", *overrides])


def _row(plan, prefix):
    (row,) = [r for r in plan.rows if r.name.startswith(prefix)]
    return row


def _loaded(tiny_vl, *overrides):
    """The Policy the trainer would build for these settings (real weights, CPU)."""
    import modalities
    from mmrlvr.train.policy import Policy

    cfg = _cfg(tiny_vl, *overrides)
    return Policy.load(cfg.model, modalities.get("vision"), torch.device("cpu"))


def test_param_count_equals_the_loaded_models(tiny_vl):
    plan = make_plan(_cfg(tiny_vl), gpus=1, gpu_mem_gib=80)
    model = _loaded(tiny_vl).model
    assert plan.dims.total == sum(p.numel() for p in model.parameters())
    visual = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    assert plan.dims.towers["vision tower"] == visual > 0
    assert plan.dims.trainable == plan.dims.total


@pytest.mark.parametrize("kind", ["qwen2-audio", "qwen2.5-omni"])
def test_audio_models_count_as_load_model_builds_them(kind, tmp_path):
    """Qwen2-Audio through its architectures class, the full Omni config through its thinker."""
    from mmrlvr.train.policy import load_model
    from mmrlvr.tiny import build_tiny

    path = build_tiny(kind, tmp_path / kind)
    plan = make_plan(_cfg(path, "model.modality=audio", "model.freeze_audio=true"), gpus=1,
                     gpu_mem_gib=80)
    model = load_model(str(path), torch.float32)
    assert plan.dims.total == sum(p.numel() for p in model.parameters())
    audio = sum(p.numel() for n, p in model.named_parameters() if ".audio_tower." in f".{n}")
    assert plan.dims.towers["audio tower"] == audio == plan.dims.total - plan.dims.trainable


@pytest.mark.parametrize("kind", ["qwen3-vl", "qwen3-vl-moe", "gemma3", "qwen3.5-moe"])
def test_new_families_count_as_load_model_builds_them(kind, tiny_dirs):
    """Each family's towers (Gemma: `vision_tower` + projector) and, for a MoE model, the
    parameters a token runs through: the non-expert ones and top-k of n experts (Qwen3.5-MoE's
    shared expert counts whole: it is not among `experts`)."""
    from mmrlvr.train.policy import load_model

    path = tiny_dirs(kind)
    plan = make_plan(_cfg(path, "model.freeze_vision=true"), gpus=1, gpu_mem_gib=80)
    model = load_model(str(path), torch.float32)
    assert plan.dims.total == sum(p.numel() for p in model.parameters())
    towers = ("visual", "vision_tower", "multi_modal_projector")
    vision = sum(p.numel() for n, p in model.named_parameters() if set(n.split(".")) & set(towers))
    assert plan.dims.towers["vision tower"] == vision == plan.dims.total - plan.dims.trainable
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    text = model.config.get_text_config()
    if kind.endswith("moe"):
        k, n = text.num_experts_per_tok, text.num_experts
        assert experts > 0 and plan.dims.active == plan.dims.total - experts + experts * k // n
    else:
        assert experts == 0 and plan.dims.active == plan.dims.total


@pytest.mark.parametrize("overrides", [
    ["model.freeze_vision=true"], ["model.lora.r=4"],
    ["model.lora.r=8", "model.lora.target_modules=[q_proj,v_proj]"]],
    ids=["freeze_vision", "lora-qkvo", "lora-qv"])
def test_trainable_count_equals_what_policy_load_trains(tiny_vl, overrides):
    plan = make_plan(_cfg(tiny_vl, *overrides), gpus=1, gpu_mem_gib=80)
    policy = _loaded(tiny_vl, *overrides)
    assert plan.dims.trainable == sum(p.numel() for p in policy.trainable_parameters())
    assert 0 < plan.dims.trainable < plan.dims.total


def test_builtin_7b_count_matches_a_hand_count_from_its_config_json():
    h, i, layers, kv, vocab = 3584, 18944, 28, 4 * 128, 152064
    # q, k, v with biases; o; the gated MLP; two RMSNorms
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    lm = 2 * vocab * h + layers * layer + h                                 # untied embed + lm_head
    w, vi = 1280, 3420
    block = 2 * w + (w * 3 * w + 3 * w) + (w * w + w) + 2 * (w * vi + vi) + (vi * w + w)
    vision = 3 * 2 * 14 * 14 * w + 32 * block + w + (4 * w * 4 * w + 4 * w) + (4 * w * h + h)
    plan = make_plan(_cfg("Qwen/Qwen2.5-VL-7B-Instruct"), gpus=8, gpu_mem_gib=80)
    assert plan.dims.towers == {"language model": lm, "vision tower": vision}
    assert plan.dims.total == 8_292_166_656                   # the model card's count
    assert "built-in table for Qwen/Qwen2.5-VL-7B-Instruct" in plan.table()


@pytest.mark.parametrize("hub", sorted(BUILTIN))
def test_every_builtin_release_plans_offline_as_its_familys_model(hub):
    """A release's published dims build its family's model on the meta device: the family that
    lists it serves its model_type, and a MoE release runs a token through fewer parameters."""
    family = next(f for f in models.FAMILIES if hub in f.published)
    plan = make_plan(_cfg(hub), gpus=8, gpu_mem_gib=80)
    assert models.of_type(BUILTIN[hub]["model_type"]) is family
    assert f"built-in table for {hub}" in plan.table() and plan.dims.total > 1e8
    assert (plan.dims.active < 0.5 * plan.dims.total) == family.moe


def test_qwen3_omni_thinker_count_matches_a_hand_count_from_its_config_json():
    h, layers, vocab, experts, width = 2048, 48, 152064, 128, 768
    attn = h * 32 * 128 + 2 * h * 4 * 128 + 32 * 128 * h + 2 * 128      # q, k, v, o; q/k norms
    layer = attn + 2 * h + h * experts + experts * 3 * h * width        # norms, router, experts
    plan = make_plan(_cfg("Qwen/Qwen3-Omni-30B-A3B-Instruct", "model.modality=audio"), gpus=8,
                     gpu_mem_gib=80)
    assert plan.dims.towers["language model"] == layers * layer + 2 * vocab * h + h
    assert plan.dims.audio_tokens == 390 and "390 audio (a 30 s clip)" in plan.table()
    omni25 = make_plan(_cfg("Qwen/Qwen2.5-Omni-7B", "model.modality=audio"), gpus=8, gpu_mem_gib=80)
    assert omni25.dims.audio_tokens == 750                    # 25 a second after pooling


def test_qwen3_5_kv_cache_counts_only_its_full_attention_layers():
    plan = make_plan(_cfg("Qwen/Qwen3.5-35B-A3B"), gpus=8, gpu_mem_gib=80)
    d = plan.dims
    assert (d.layers, d.kv_layers) == (40, 10)                # full attention every fourth layer
    dense = make_plan(_cfg("Qwen/Qwen3-VL-8B-Instruct"), gpus=8, gpu_mem_gib=80).dims
    assert dense.kv_layers == dense.layers == 36
    kv = _row(plan, "KV cache").ddp
    cfg = plan.cfg
    seqs = cfg.train.batch_prompts * cfg.rollout.group_size // 8
    tokens = prompt_tokens(cfg, d) + cfg.rollout.max_new_tokens
    assert kv == seqs * tokens * 10 * 2 * d.kv_dim * 2        # bf16 K and V of 10 layers


def test_bytes_by_hand_on_the_tiny_model(tiny_vl):
    tc = json.loads((Path(tiny_vl) / "config.json").read_text())
    tc = tc.get("text_config", tc)
    h, layers, heads, kvh, vocab = (tc["hidden_size"], tc["num_hidden_layers"],
                                    tc["num_attention_heads"], tc["num_key_value_heads"],
                                    tc["vocab_size"])
    cfg = _cfg(tiny_vl, "model.dtype=float32", "model.max_pixels=12544", "train.batch_prompts=4",
               "rollout.group_size=4", "rollout.max_new_tokens=16", "train.micro_batch=2")
    plan = make_plan(cfg, gpus=2, gpu_mem_gib=80)
    n = plan.dims.total
    # 112*112 px = 16 image tokens, + 256 text = 272 prompt tokens; 288 with the completion
    seqs, length = 4 * 4 // 2, 16 + 256 + 16
    kv = seqs * length * layers * 2 * kvh * (h // heads) * 4
    assert _row(plan, "KV cache").ddp == _row(plan, "KV cache").fsdp2 == kv
    assert _row(plan, "logits").ddp == 2 * 16 * vocab * (4 + 4 + 4)
    assert _row(plan, "trainable weights").ddp == 4 * n
    assert _row(plan, "AdamW").ddp == 8 * n
    assert _row(plan, "gradients").fsdp2 == math.ceil(4 * n / 2)
    assert _row(plan, "fp32 weights for generate").ddp == 0          # fp32 compute: no cast copy


def test_bf16_params_halve_masters_grads_and_adam(tiny_vl):
    fp32 = make_plan(_cfg(tiny_vl, "model.dtype=bfloat16"), gpus=1, gpu_mem_gib=80)
    bf16 = make_plan(_cfg(tiny_vl, "model.dtype=bfloat16", "model.param_dtype=bfloat16"),
                     gpus=1, gpu_mem_gib=80)
    for name in ("trainable weights", "gradients", "AdamW"):
        assert _row(fp32, name).ddp == 2 * _row(bf16, name).ddp > 0
    assert _row(fp32, "AdamW").ddp == 8 * fp32.dims.trainable


def test_gradient_checkpointing_lowers_activations_and_the_update_total(tiny_vl):
    on = make_plan(_cfg(tiny_vl, "model.gradient_checkpointing=true"), gpus=1, gpu_mem_gib=80)
    off = make_plan(_cfg(tiny_vl, "model.gradient_checkpointing=false"), gpus=1, gpu_mem_gib=80)
    assert _row(on, "activations, checkpointing on").ddp < \
        _row(on, "activations, checkpointing off").ddp
    assert _row(on, "activations, checkpointing on").counted
    assert not _row(off, "activations, checkpointing on").counted
    assert on.total("ddp", "update") < off.total("ddp", "update")
    assert "checkpointing on (used)" in on.table() and "checkpointing off (used)" in off.table()


def test_fsdp2_divides_the_sharded_parts_by_the_gpu_count():
    cfg = load_config(ROOT / "configs/geo3k_qwen25vl7b.yaml")
    one, eight = (make_plan(cfg, gpus=g, gpu_mem_gib=80) for g in (1, 8))
    for name in ("trainable weights", "frozen weights", "AdamW", "gradients", "reference model"):
        assert _row(one, name).ddp == _row(one, name).fsdp2
        assert _row(eight, name).fsdp2 == math.ceil(_row(one, name).ddp / 8)
        if name != "gradients":
            assert _row(eight, name).ddp == _row(one, name).ddp
    # DDP on 8: the gradients are views into its buckets, counted once there
    assert _row(eight, "gradients").ddp == 0
    assert _row(eight, "DDP gradient buckets").ddp == _row(one, "gradients").ddp
    assert _row(eight, "KV cache").fsdp2 * 8 == _row(one, "KV cache").fsdp2      # 48 vs 384 seqs
    gathered = _row(eight, "bf16 weights for generate").fsdp2
    assert gathered == 2 * eight.dims.total                   # the whole model, bf16, every GPU
    assert eight.peak("fsdp2")[0] == max(eight.total("fsdp2", ph) for ph in ("rollout", "update"))


@pytest.mark.parametrize("path", RECIPES_7B, ids=[p.name for p in RECIPES_7B])
def test_every_7b_recipe_fits_8_gpus_of_80_gb(path):
    cfg = load_config(path)
    assert (cfg.model.dtype, cfg.model.param_dtype) == ("bfloat16", "float32")
    # full fine-tunes shard; LoRA runs under DDP (the trainer shards no LoRA model)
    strategy = "ddp" if cfg.model.lora.r > 0 else "fsdp2"
    assert cfg.train.strategy == strategy
    plan = make_plan(cfg, gpus=8, gpu_mem_gib=80)
    plan.check(strategy)
    if cfg.model.lora.r == 0:               # a full 7B fine-tune is what needs the 8 GPUs
        assert not plan.fits("ddp") and not make_plan(cfg, gpus=1, gpu_mem_gib=80).fits("fsdp2")
    header = f"mmrlvr plan configs/{path.name} --gpus 8 --gpu-mem 80\n#     -> fits {strategy}: " \
        f"peak {plan.peak(strategy)[0] / GiB:.1f} GiB per GPU ({plan.peak(strategy)[1]}"
    assert header in path.read_text()


def test_72b_full_finetune_on_one_80_gb_gpu_fails_check_ddp_naming_the_overflow():
    plan = make_plan(_cfg("Qwen/Qwen2.5-VL-72B-Instruct"), gpus=1, gpu_mem_gib=80, label="72b")
    assert plan.dims.total > 73e9 and plan.choose_strategy() == "fsdp2"
    with pytest.raises(ConfigError, match="does not fit fsdp2 on 1 x 80 GiB"):
        plan.check("auto")
    with pytest.raises(ConfigError) as err:
        plan.check("ddp")
    msg = str(err.value)
    over = plan.peak("ddp")[0] / GiB - 80
    assert f"{over:.1f} GiB over" in msg and "AdamW moments" in msg
    for tip in ("train.strategy=fsdp2", "model.gradient_checkpointing=true", "model.lora.r",
                "train.micro_batch"):
        assert tip in msg


def test_small_model_chooses_ddp_and_unknown_hub_ids_fail_clearly(tiny_vl):
    plan = make_plan(_cfg(tiny_vl), gpus=1, gpu_mem_gib=80)
    assert plan.choose_strategy() == plan.strategy() == "ddp" and plan.fits("auto")
    with pytest.raises(ConfigError, match="'zero3'"):
        plan.check("zero3")
    with pytest.raises(ConfigError, match="nobody/NoSuchModel-7B.*download"):
        make_plan(_cfg("nobody/NoSuchModel-7B"), gpus=1, gpu_mem_gib=80)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the defaults read the visible GPU")
def test_without_a_gpu_one_80_gib_gpu_is_assumed_and_said(tiny_vl):
    plan = make_plan(_cfg(tiny_vl))
    assert (plan.gpus, plan.gpu_mem) == (1, 80.0)
    assert "80 GiB assumed: no GPU visible" in plan.table()


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mmrlvr.cli", "plan", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_cli_prints_the_table_and_exits_0_when_it_fits_1_when_not():
    fits = _cli("configs/geo3k_qwen25vl7b.yaml", "--gpus", "8", "--gpu-mem", "80")
    assert fits.returncode == 0, fits.stderr
    assert "train.strategy fsdp2 -> fsdp2: fits" in fits.stdout and "peak" in fits.stdout
    short = _cli("configs/geo3k_qwen25vl7b.yaml", "--gpus", "1", "--gpu-mem", "80", "--json")
    assert short.returncode == 1
    data = json.loads(short.stdout)
    assert data["totals"]["fsdp2"]["fits"] is False and data["gpus"] == 1


def test_mistral_small_3_1_count_matches_a_hand_count_from_its_config_json():
    """Mistral-Small-3.1-24B-Instruct-2503 (Pixtral + Mistral): 40 layers of 32 query / 8 KV heads
    of 128, a 32768-wide gated MLP, untied 131072-token embeddings; an image with no pixel cap
    is the tower's 1540 px square: 55 x 55 [IMG] + 55 breaks."""
    h, i, layers, vocab, q, kv = 5120, 32768, 40, 131072, 32 * 128, 8 * 128
    layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    plan = make_plan(_cfg("mistralai/Mistral-Small-3.1-24B-Instruct-2503"), gpus=8, gpu_mem_gib=80)
    assert plan.dims.towers["language model"] == layers * layer + 2 * vocab * h + h
    assert 23.9e9 < plan.dims.total < 24.1e9                  # "24 billion parameters"
    assert plan.dims.image_tokens == 55 * 56


def test_glm_4_1v_count_matches_a_hand_count_from_its_config_json():
    """GLM-4.1V-9B-Thinking: a GLM-4 decoder of 40 layers (32 query heads of 128 with q/k/v
    biases, 2 KV heads, a fused 13696-wide gated MLP, four RMSNorms a layer), untied 151552-token
    embeddings: 9.40 B, and 10.29 B with its 24-block vision tower (the model card's 10.3 B)."""
    h, i, layers, vocab, q, kv = 4096, 13696, 40, 151552, 32 * 128, 2 * 128
    layer = (h * q + q) + 2 * (h * kv + kv) + q * h + 3 * h * i + 4 * h
    plan = make_plan(_cfg("zai-org/GLM-4.1V-9B-Thinking"), gpus=8, gpu_mem_gib=80)
    assert plan.dims.towers["language model"] == layers * layer + 2 * vocab * h + h
    assert 10.25e9 < plan.dims.total < 10.35e9
    assert plan.dims.kv_dim == kv


def test_dense_qwen3_5_plans_its_hybrid_decoder_offline():
    """Qwen3.5-4B (dense): 32 layers, a KV cache in the 8 full-attention ones only, every
    parameter active, and one 248320 x 2560 embedding (tied to the head)."""
    plan = make_plan(_cfg("Qwen/Qwen3.5-4B"), gpus=8, gpu_mem_gib=80)
    d = plan.dims
    assert (d.layers, d.kv_layers, d.kv_dim, d.hidden) == (32, 8, 4 * 256, 2560)
    assert d.active == d.total and 4.0e9 < d.towers["language model"] < 4.4e9
    assert d.root[0] < 2 * 248320 * 2560                      # tied: the head adds no matrix
