"""The vLLM backend's weight names and LoRA merge, without vLLM or a GPU: every parameter of the
tiny models maps to the checkpoint name transformers writes (and vLLM's own mapper places), known
names map exactly, wrapper and peft names are stripped, unknown ones fail loudly, a LoRA adapter
is merged as peft's merge_and_unload merges it, and later syncs send only the trainable weights.
Qwen3.5-MoE and the Qwen3-Omni thinker, whose checkpoints hold one weight per expert, are synced
exactly as transformers saves them (names and values); Qwen3-VL-MoE, whose checkpoints hold its
fused experts transposed (transformers' save does not write them so), exactly as a file in the
released layout that transformers loads back to the same model. The Qwen2.5-Omni thinker and
Llama: test_vllm_names_text_omni.py. The unit-by-unit gathering: test_vllm_sync.py; the engine:
test_vllm_engine.py."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from mmrlvr import models
from mmrlvr.rollout.vllm_sync import checkpoint_name, merge_lora, plain_name, unit_key
from tests.vllm_helpers import load, synced, with_lora

KINDS = {"qwen2-vl": "qwen2_vl", "qwen2.5-vl": "qwen2_5_vl", "qwen2-audio": "qwen2_audio",
         "qwen3-vl": "qwen3_vl", "qwen3-vl-moe": "qwen3_vl_moe", "qwen3.5": "qwen3_5",
         "gemma3": "gemma3", "internvl": "internvl", "smolvlm": "smolvlm",
         "llava-onevision": "llava_onevision", "mistral3": "mistral3", "glm4v": "glm4v"}

# vLLM's hf_to_vllm_mapper prefixes (applied in turn, first match wins): 0.33.0's
# Qwen2VLForConditionalGeneration / Qwen2_5_VLForConditionalGeneration, and the Qwen3-VL / Qwen3.5
# ones (model.visual., model.language_model., lm_head.); Qwen2AudioForConditionalGeneration has no
# mapper, and the Gemma 3 / InternVL ones map transformers-5 names onto the checkpoint tree that
# their checkpoints already use, so checkpoint names pass through them unchanged.
VLLM_VL_PREFIXES = {"model.language_model.": "language_model.model.", "model.visual.": "visual.",
                    "lm_head.": "language_model.lm_head.", "model.": "language_model.model."}
VLLM_QWEN3_PREFIXES = {"model.visual.": "visual.", "lm_head.": "language_model.lm_head.",
                       "model.language_model.": "language_model.model."}
_TEXT_ROOTS = ("language_model.model.", "language_model.lm_head.")
VLLM_MODULE_ROOTS = {"qwen2_vl": _TEXT_ROOTS + ("visual.",),
                     "qwen2_audio": _TEXT_ROOTS + ("audio_tower.", "multi_modal_projector."),
                     "gemma3": _TEXT_ROOTS + ("vision_tower.", "multi_modal_projector.")}
for _vl in ("qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5"):
    VLLM_MODULE_ROOTS[_vl] = VLLM_MODULE_ROOTS["qwen2_vl"]
VLLM_MODULE_ROOTS["internvl"] = VLLM_MODULE_ROOTS["gemma3"]
# vLLM's Idefics3/SmolVLM model: model.text_model / model.vision_model / model.connector / lm_head,
# loaded by name with no mapper (the checkpoint's own tree)
VLLM_MODULE_ROOTS["smolvlm"] = ("model.text_model.", "model.vision_model.", "model.connector.", "lm_head.")
# vLLM's LLaVA-OneVision: Gemma 3's tree plus its image_newline parameter
VLLM_MODULE_ROOTS["llava_onevision"] = VLLM_MODULE_ROOTS["gemma3"] + ("image_newline",)
# vLLM's Mistral3ForConditionalGeneration: vision_tower / multi_modal_projector / language_model, its
# mapper renaming only transformers-5 prefixes (model.language_model. ...): Gemma 3's tree
VLLM_MODULE_ROOTS["mistral3"] = VLLM_MODULE_ROOTS["gemma3"]
# vLLM's Glm4vForConditionalGeneration: visual / language_model, Qwen3-VL's mapper prefixes
VLLM_MODULE_ROOTS["glm4v"] = VLLM_MODULE_ROOTS["qwen2_vl"]
# the families whose checkpoints hold one weight per expert (the model: fused experts); vLLM's
# Qwen3_5MoeForConditionalGeneration has Qwen3.5's mapper, its Qwen3OmniMoeThinker... this one
PER_EXPERT_KINDS = {"qwen3.5-moe": "qwen3_5_moe", "qwen3-omni": "qwen3_omni_moe_thinker"}
VLLM_OMNI_PREFIXES = {"thinker.lm_head.": "language_model.lm_head.",
                      "thinker.model.": "language_model.model.", "thinker.": ""}
VLLM_MODULE_ROOTS["qwen3_5_moe"] = VLLM_MODULE_ROOTS["qwen2_vl"]
VLLM_MODULE_ROOTS["qwen3_omni_moe_thinker"] = _TEXT_ROOTS + ("audio_tower.", "visual.")
# vLLM's Qwen2_5OmniThinkerForConditionalGeneration: the Qwen3-Omni thinker's mapper and tree
VLLM_MODULE_ROOTS["qwen2_5_omni_thinker"] = VLLM_MODULE_ROOTS["qwen3_omni_moe_thinker"]
# vLLM's LlamaForCausalLM: no mapper, transformers' own tree (model. / lm_head.)
VLLM_MODULE_ROOTS["llama"] = ("model.", "lm_head.")
# the Omni thinkers' full checkpoints (thinker + talker), by the transformers class prefix
OMNI_WRAPPERS = {"qwen3_omni_moe_thinker": "Qwen3OmniMoe", "qwen2_5_omni_thinker": "Qwen2_5Omni"}


def vllm_internal_name(name: str, model_type: str) -> str:
    prefixes = {"qwen2_vl": VLLM_VL_PREFIXES, "qwen2_5_vl": VLLM_VL_PREFIXES,
                "qwen3_omni_moe_thinker": VLLM_OMNI_PREFIXES,
                "qwen2_5_omni_thinker": VLLM_OMNI_PREFIXES}.get(
        model_type, VLLM_QWEN3_PREFIXES if model_type.startswith(("qwen3", "glm4v")) else {})
    for prefix, new in prefixes.items():
        if name.startswith(prefix):
            return new + name[len(prefix):]
    return name


@pytest.fixture(scope="module")
def tiny_dirs(tiny_dirs):
    """The session's tiny model dirs (shared with test_families) of every kind here."""
    return {kind: Path(tiny_dirs(kind)) for kind in (*KINDS, *PER_EXPERT_KINDS)}


def checkpoint_keys(path: Path) -> set[str]:
    from safetensors import safe_open

    keys = set()
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            keys |= set(f.keys())
    return keys


# ------------------------------------------------------------------------------- names

@pytest.mark.parametrize("kind", list(KINDS))
def test_every_parameter_maps_to_the_checkpoint_transformers_writes(tiny_dirs, kind):
    model_type = KINDS[kind]
    model = load(tiny_dirs[kind])
    assert model.config.model_type == model_type
    names = [n for n, _ in model.named_parameters()]
    mapped = [checkpoint_name(plain_name(n), model_type) for n in names]
    assert len(set(mapped)) == len(mapped) == len(names)              # no collisions
    assert set(mapped) == checkpoint_keys(tiny_dirs[kind])            # what vLLM loads from disk
    # ... and vLLM's own mapper puts each of them under one of its model's modules
    roots = VLLM_MODULE_ROOTS[model_type]
    assert all(vllm_internal_name(m, model_type).startswith(roots) for m in mapped)
    assert synced(model, model_type).keys() == set(mapped)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_known_vision_language_names_map_exactly(model_type):
    cases = {
        "model.language_model.layers.3.self_attn.q_proj.weight":
            "model.layers.3.self_attn.q_proj.weight",
        "model.language_model.embed_tokens.weight": "model.embed_tokens.weight",
        "model.language_model.norm.weight": "model.norm.weight",
        "model.visual.blocks.1.attn.qkv.bias": "visual.blocks.1.attn.qkv.bias",
        "model.visual.merger.mlp.0.weight": "visual.merger.mlp.0.weight",
        "model.visual.patch_embed.proj.weight": "visual.patch_embed.proj.weight",
        "lm_head.weight": "lm_head.weight",
        "model.layers.0.mlp.up_proj.weight": "model.layers.0.mlp.up_proj.weight",  # already so
        "visual.blocks.0.norm1.weight": "visual.blocks.0.norm1.weight",
    }
    for name, want in cases.items():
        assert checkpoint_name(name, model_type) == want
    assert vllm_internal_name("model.layers.3.self_attn.q_proj.weight", model_type) == \
        "language_model.model.layers.3.self_attn.q_proj.weight"


def test_known_audio_names_map_exactly():
    cases = {
        "model.language_model.layers.2.mlp.down_proj.weight":
            "language_model.model.layers.2.mlp.down_proj.weight",
        "model.audio_tower.layers.0.self_attn.k_proj.weight":
            "audio_tower.layers.0.self_attn.k_proj.weight",
        "model.audio_tower.embed_positions.weight": "audio_tower.embed_positions.weight",
        "model.multi_modal_projector.linear.bias": "multi_modal_projector.linear.bias",
        "lm_head.weight": "language_model.lm_head.weight",
        "language_model.lm_head.weight": "language_model.lm_head.weight",     # transformers 4
        "audio_tower.conv1.weight": "audio_tower.conv1.weight",
    }
    for name, want in cases.items():
        assert checkpoint_name(name, "qwen2_audio") == want


def test_unknown_names_and_families_fail_loudly():
    with pytest.raises(ValueError, match="no checkpoint name"):
        checkpoint_name("vision_tower.blocks.0.weight", "qwen2_vl")
    with pytest.raises(ValueError, match="no checkpoint name"):
        checkpoint_name("model.visual.blocks.0.norm1.weight", "qwen2_audio")
    with pytest.raises(ValueError, match="no weight-name mapping for model type 'llava'"):
        checkpoint_name("model.layers.0.weight", "llava")


def test_a_family_without_names_is_refused_by_name(monkeypatch):
    # every family has names now; one without (`vllm = None`, a new family's default) is
    # refused naming its model type, and the mapped ones are listed
    family = type(models.of_type("llama"))
    monkeypatch.setattr(family, "vllm", None)
    with pytest.raises(ValueError, match=r"no weight-name mapping for model type 'llama' "
                                         r"\(have \[.*'qwen2_5_omni_thinker'"):
        checkpoint_name("model.layers.0.mlp.up_proj.weight", "llama")


def test_wrappers_and_peft_names_are_stripped():
    assert plain_name("base_model.model.model.language_model.layers.0.self_attn.q_proj"
                      ".base_layer.weight") == \
        "model.language_model.layers.0.self_attn.q_proj.weight"
    assert plain_name("base_model.model.model.language_model.layers.0.self_attn.q_proj"
                      ".lora_A.default.weight") is None
    assert plain_name("model.language_model.layers._checkpoint_wrapped_module.mlp.up_proj.weight") \
        == "model.language_model.layers.mlp.up_proj.weight"
    assert plain_name("_orig_mod.lm_head.weight") == "lm_head.weight"
    assert plain_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert plain_name("base_model.model.lm_head.original_module.weight") is None
    assert unit_key("base_model.model.model.visual.blocks.1.attn.qkv.lora_B.default.weight") \
        == "base_model.model.model.visual.blocks.1"
    assert unit_key("base_model.model.lm_head.base_layer.weight") == \
        unit_key("base_model.model.lm_head.lora_A.default.weight") == "base_model.model.lm_head"
    assert unit_key("model.language_model.norm.weight") == "model.language_model.norm"


# ------------------------------------------------------------------------------- LoRA

def test_lora_merge_equals_peft_merge_and_unload(tiny_dirs):
    peft_model = with_lora(load(tiny_dirs["qwen2.5-vl"]))
    reference = copy.deepcopy(peft_model).merge_and_unload()
    want = {checkpoint_name(n, "qwen2_5_vl"): p.detach() for n, p in reference.named_parameters()}
    got = synced(peft_model, "qwen2_5_vl")
    assert got.keys() == want.keys()
    for name in want:
        assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)
    adapted = "model.layers.1.self_attn.v_proj.weight"
    base = peft_model.base_model.model.model.language_model.layers[1].self_attn.v_proj
    assert not torch.allclose(got[adapted], base.base_layer.weight)      # the delta is in
    # merge_lora is W + scaling·B@A (fan_in_fan_out transposes the delta)
    w, a, b = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    assert_close(merge_lora(w, [(a, b, 0.5)]), w + 0.5 * b @ a)
    assert_close(merge_lora(w.T, [(a, b, 0.5)], fan_in_fan_out=True), w.T + 0.5 * (b @ a).T)
    # an adapter peft already merged into its base is not added twice
    peft_model.merge_adapter()
    again = synced(peft_model, "qwen2_5_vl")
    for name in want:
        assert_close(again[name], want[name], rtol=0, atol=1e-6, msg=name)


def test_later_syncs_send_only_what_training_changes(tiny_dirs):
    model = load(tiny_dirs["qwen2-vl"])
    for name, p in model.named_parameters():
        if ".visual." in f".{name}":
            p.requires_grad_(False)
    sent = synced(model, "qwen2_vl", only_trainable=True)
    assert sent and not any(n.startswith("visual.") for n in sent)
    assert len(sent) == sum(p.requires_grad for p in model.parameters())
    peft_model = with_lora(load(tiny_dirs["qwen2-vl"]), targets=("q_proj", "v_proj"))
    sent = synced(peft_model, "qwen2_vl", only_trainable=True)
    assert sorted(sent) == sorted(f"model.layers.{i}.self_attn.{m}_proj.weight"
                                  for i in range(4) for m in ("q", "v"))


# ------------------------------------------------------------------------------- per-expert

def saved_checkpoint(model, model_type: str, out: Path) -> dict[str, torch.Tensor]:
    """What transformers writes for `model`'s checkpoint, {name: tensor}: its own save, and for
    an Omni thinker the save of the full Omni model (thinker + talker, as released, vLLM's
    input) holding this thinker, talker off."""
    import transformers
    from safetensors.torch import load_file

    if model_type in OMNI_WRAPPERS:
        wrapper = OMNI_WRAPPERS[model_type]
        full = getattr(transformers, f"{wrapper}ForConditionalGeneration")(
            getattr(transformers, f"{wrapper}Config")(thinker_config=model.config.to_dict(),
                                                      enable_audio_output=False))
        full.thinker.load_state_dict(model.state_dict())
        model = full
    model.save_pretrained(out)
    tensors: dict[str, torch.Tensor] = {}
    for file in out.glob("*.safetensors"):
        tensors.update(load_file(str(file)))
    return tensors


def assert_sent_as_saved(model: torch.nn.Module, model_type: str, want: dict[str, torch.Tensor]
                         ) -> None:
    """The sync sends exactly `want`: the same names, each tensor bitwise equal in fp32 and bf16,
    and vLLM's own mapper puts every name under one of its model's modules."""
    for dtype in (torch.float32, torch.bfloat16):
        got = synced(model, model_type, dtype)
        assert got.keys() == want.keys()                          # nothing left out, nothing extra
        for name, tensor in want.items():
            assert got[name].dtype == dtype and torch.equal(got[name], tensor.to(dtype)), name
    roots = VLLM_MODULE_ROOTS[model_type]
    assert all(vllm_internal_name(n, model_type).startswith(roots) for n in want)


@pytest.mark.parametrize("kind", list(PER_EXPERT_KINDS))
def test_fused_experts_sync_as_transformers_saves_them(tiny_dirs, kind, tmp_path):
    model_type = PER_EXPERT_KINDS[kind]
    model = load(tiny_dirs[kind])
    want = saved_checkpoint(model, model_type, tmp_path)
    assert_sent_as_saved(model, model_type, want)
    # the layout, by value: expert e's gate is the first half of gate_up_proj[e]'s rows, up the
    # second; down_proj[e] is its down projection
    experts = model.model.language_model.layers[0].mlp.experts
    module = checkpoint_name("model.language_model.layers.0.mlp.experts", model_type)
    inter = experts.down_proj.shape[-1]
    for e in range(experts.gate_up_proj.shape[0]):
        assert torch.equal(want[f"{module}.{e}.gate_proj.weight"], experts.gate_up_proj[e, :inter])
        assert torch.equal(want[f"{module}.{e}.up_proj.weight"], experts.gate_up_proj[e, inter:])
        assert torch.equal(want[f"{module}.{e}.down_proj.weight"], experts.down_proj[e])
    if kind == "qwen3-omni":                # the full checkpoint: thinker. + the thinker's save
        alone = checkpoint_keys(tiny_dirs[kind])
        assert set(want) == {f"thinker.{k}" for k in alone}


@pytest.mark.parametrize("kind", list(PER_EXPERT_KINDS))
def test_lora_on_a_moe_family_merges_as_peft_and_splits_the_experts(tiny_dirs, kind, tmp_path):
    model_type = PER_EXPERT_KINDS[kind]
    base = load(tiny_dirs[kind])
    unmerged = saved_checkpoint(base, model_type, tmp_path / "base")
    targets = models.of_type(model_type).lora_targets + ("qkv",)            # + the ViT's
    if kind == "qwen3.5-moe":                 # its shared expert's linears (no fused experts)
        targets += ("gate_proj", "up_proj", "down_proj")
    peft_model = with_lora(base, targets=targets)
    want = saved_checkpoint(copy.deepcopy(peft_model).merge_and_unload(), model_type,
                            tmp_path / "merged")
    got = synced(peft_model, model_type)
    assert got.keys() == want.keys()
    for name in want:
        assert_close(got[name], want[name], rtol=0, atol=1e-6, msg=name)
    adapted = {checkpoint_name(plain_name(f"{n}.base_layer.weight"), model_type)
               for n, m in peft_model.named_modules() if hasattr(m, "lora_A")}
    assert adapted and {n for n in want if not torch.equal(got[n], unmerged[n])} == adapted
    if kind == "qwen3.5-moe":
        assert any(".shared_expert.gate_proj." in n for n in adapted)


def test_lora_on_fused_expert_parameters_is_refused_by_name(tiny_dirs):
    from peft import LoraConfig, get_peft_model

    # peft turns model.lora.target_modules gate_proj / up_proj / down_proj of the Omni thinker
    # into LoRA on its fused expert parameters (ParamWrapper): the sync would send their bases
    # without the delta, so it refuses, naming the module
    omni = with_lora(load(tiny_dirs["qwen3-omni"]), targets=("q_proj", "gate_proj", "up_proj",
                                                              "down_proj"))
    assert any(type(m).__name__ == "ParamWrapper" for m in omni.modules())
    with pytest.raises(NotImplementedError, match=r"layers\.0\.mlp\.experts adapts the parameter"):
        synced(omni, "qwen3_omni_moe_thinker")
    # ... as it does the same LoRA asked for by parameter (peft's target_parameters)
    moe = get_peft_model(load(tiny_dirs["qwen3.5-moe"]), LoraConfig(
        r=4, target_modules=[], target_parameters=["mlp.experts.gate_up_proj"]))
    with pytest.raises(NotImplementedError,
                       match=r"layers\.0\.mlp\.experts adapts the parameter 'gate_up_proj'"):
        synced(moe, "qwen3_5_moe")


# ------------------------------------------------------------------------------- transposed experts

def released_qwen3_vl_moe(tiny: Path, out: Path) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A Qwen3-VL-MoE whose hidden size is neither 2·I nor I, so a transposed expert tensor never
    has the shape of an untransposed one (the tiny kind's 128 = 2·64 has), and its checkpoint in
    `out` in the released layout: transformers' save (the model's [E, 2I, H] / [E, H, I]) with
    each fused expert tensor's last two dims swapped, [E, H, 2I] / [E, I, H], the layout
    transformers' `qwen3_vl_moe` conversion transposes from on load."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, Qwen3VLMoeForConditionalGeneration

    config = AutoConfig.from_pretrained(tiny)
    config.text_config.moe_intermediate_size = 48
    assert config.text_config.hidden_size not in (48, 96)
    torch.manual_seed(0)
    model = Qwen3VLMoeForConditionalGeneration(config).eval()
    model.save_pretrained(out)
    (file,) = out.glob("*.safetensors")
    fused = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")
    released = {name: tensor.transpose(1, 2).contiguous() if name.endswith(fused) else tensor
                for name, tensor in load_file(str(file)).items()}
    save_file(released, str(file), metadata={"format": "pt"})
    return model, released


def test_qwen3_vl_moe_experts_sync_in_the_released_transposed_layout(tiny_dirs, tmp_path):
    model, released = released_qwen3_vl_moe(tiny_dirs["qwen3-vl-moe"], tmp_path)
    text = model.config.text_config
    experts, hidden, inter = text.num_experts, text.hidden_size, text.moe_intermediate_size
    layer = "model.language_model.layers.0.mlp.experts"
    assert released[f"{layer}.gate_up_proj"].shape == (experts, hidden, 2 * inter)
    assert released[f"{layer}.down_proj"].shape == (experts, inter, hidden)
    # transformers transposes the released file on load: it loads as the model it was made from
    loaded = load(tmp_path)
    want, got = model.state_dict(), loaded.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    # ... and the sync sends exactly that file: every name, every value, fp32 and bf16
    for source in (model, loaded):
        for dtype in (torch.float32, torch.bfloat16):
            sent = synced(source, "qwen3_vl_moe", dtype)
            assert sent.keys() == released.keys()
            for name, tensor in released.items():
                assert sent[name].dtype == dtype and torch.equal(sent[name], tensor.to(dtype)), \
                    f"{name}: sent {tuple(sent[name].shape)}, the file holds {tuple(tensor.shape)}"
