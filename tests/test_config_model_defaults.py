"""Pixel bounds and the completion budget come from the model unless the config sets them: a
tiny model's small ones, a cached hub model's real ones, stated fallbacks otherwise; every
shipped config keeps the values it ran with; `mmrlvr train --print-config` shows where each came
from, and `mmrlvr --version` says what is installed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from mmrlvr.config import (Config, ConfigError, ModelConfig, RolloutConfig, fill_model_defaults,
                           load_config, model_defaults, resolve_model_defaults)
from mmrlvr.config.model_defaults import FALLBACK_MAX_NEW_TOKENS, FALLBACK_PIXELS

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
OLD_DEFAULTS = {"model.min_pixels": 56 * 56, "model.max_pixels": 112 * 112,
                "rollout.max_new_tokens": 64}
"""What a config that left these keys out ran with before they came from the model."""
FAMILY = {"tones_cpu.yaml": "qwen2-audio", "qwen2audio7b_rubrics.yaml": "qwen2-audio",
          "qwen25omni7b_rubrics.yaml": "qwen2.5-omni"}
"""The tiny family of the model each shipped config that leaves a key out runs on."""
NO_IMAGES = {"avqa_qwen3omni30b_a3b_lora.yaml", "arith_om_grpo_smollm2_cpu.yaml",
             "arith_cue_grpo_smollm2_cpu.yaml",
             "arith_smollm2_lora_cpu.yaml", "clip_tools_cpu.yaml"}
"""Configs written after the defaults came from the model, for audio or text rows: they leave only
the pixel bounds (which no row of theirs uses) to the model, and set rollout.max_new_tokens."""


def _values(cfg: Config) -> dict[str, int]:
    return {"model.min_pixels": cfg.model.min_pixels, "model.max_pixels": cfg.model.max_pixels,
            "rollout.max_new_tokens": cfg.rollout.max_new_tokens}


@pytest.fixture(scope="module")
def tiny_audio_dirs(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return {kind: build_tiny(kind, tmp_path_factory.mktemp(kind.replace(".", "_")))
            for kind in ("qwen2-audio", "qwen2.5-omni")}


def test_a_tiny_model_gives_its_own_small_values(tiny_vl):
    cfg, sources = fill_model_defaults(Config(model=ModelConfig(path=str(tiny_vl))))
    assert _values(cfg) == OLD_DEFAULTS
    assert sources["model.min_pixels"] == (
        f"from {tiny_vl / 'processor_config.json'}: image_processor.size.shortest_edge")
    assert sources["model.max_pixels"].endswith("image_processor.size.longest_edge")
    assert sources["rollout.max_new_tokens"] == (
        f"from {tiny_vl / 'generation_config.json'}: max_new_tokens")


def test_values_the_config_sets_are_kept(tiny_vl):
    cfg = Config(model=ModelConfig(path=str(tiny_vl), min_pixels=28 * 28, max_pixels=56 * 56),
                 rollout=RolloutConfig(max_new_tokens=200))
    assert resolve_model_defaults(cfg) is cfg                      # nothing to fill: a no-op
    cfg.model.max_pixels = 0
    filled, sources = fill_model_defaults(cfg)
    assert _values(filled) == {"model.min_pixels": 784, "model.max_pixels": 12544,
                               "rollout.max_new_tokens": 200}
    assert list(sources) == ["model.max_pixels"] and cfg.model.max_pixels == 0   # a copy


def test_a_set_minimum_above_the_models_maximum_is_refused(tiny_vl):
    cfg = Config(model=ModelConfig(path=str(tiny_vl), min_pixels=512 * 512))
    with pytest.raises(ConfigError, match=r"'model.min_pixels' \(262144, set in the config\) "
                                          r"must be <= model.max_pixels \(12544, from "):
        resolve_model_defaults(cfg)


def test_an_audio_model_without_an_image_processor(tiny_audio_dirs):
    found = model_defaults(str(tiny_audio_dirs["qwen2-audio"]))
    assert (found.min_pixels, found.max_pixels, found.max_new_tokens) == (3136, 12544, 64)
    assert found.sources["model.max_pixels"] == "unused: the model has no image processor"


def _fake_cache(root: Path, repo: str, files: dict[str, dict]) -> None:
    """The layout huggingface_hub keeps a downloaded repo in."""
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text("abc123")
    snap = base / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name, content in files.items():
        (snap / name).write_text(json.dumps(content))


def test_a_hub_id_is_read_from_the_local_cache_only(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    _fake_cache(tmp_path, "Org/VL-7B", {   # Qwen2.5-VL-7B-Instruct's layout: no budget given
        "config.json": {"model_type": "qwen2_5_vl"},
        "preprocessor_config.json": {"min_pixels": 3136, "max_pixels": 12845056,
                                     "patch_size": 14, "merge_size": 2,
                                     "image_processor_type": "Qwen2_5_VLImageProcessor"},
        "generation_config.json": {"do_sample": True, "temperature": 1e-6}})
    _fake_cache(tmp_path, "Org/Chat", {"config.json": {}, "generation_config.json":
                                       {"max_new_tokens": 2048}})
    cfg, sources = fill_model_defaults(Config(model=ModelConfig(path="Org/VL-7B")))
    assert _values(cfg) == {"model.min_pixels": 3136, "model.max_pixels": 12845056,
                            "rollout.max_new_tokens": FALLBACK_MAX_NEW_TOKENS}
    assert sources["model.max_pixels"].endswith("preprocessor_config.json: max_pixels")
    assert "has no max_new_tokens" in sources["rollout.max_new_tokens"]
    assert model_defaults("Org/Chat").max_new_tokens == 2048
    missing = model_defaults("Org/Absent")
    assert (missing.min_pixels, missing.max_pixels) == FALLBACK_PIXELS
    assert "not found locally" in missing.sources["rollout.max_new_tokens"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_keeps_the_values_it_ran_with(path, tiny_audio_dirs):
    raw = yaml.safe_load(path.read_text())
    left_out = [key for key in OLD_DEFAULTS
                if key.split(".")[1] not in (raw.get(key.split(".")[0]) or {})]
    if path.name in NO_IMAGES:
        assert left_out == ["model.min_pixels", "model.max_pixels"], left_out
        assert load_config(path).model.modality in ("audio", "text")
        return
    assert (path.name in FAMILY) == bool(left_out), f"{path.name} leaves out {left_out}"
    cfg = load_config(path)
    before = {key: OLD_DEFAULTS[key] if key in left_out else value
              for key, value in _values(cfg).items()}
    model = str(tiny_audio_dirs[FAMILY[path.name]]) if left_out else "/nonexistent/model"
    assert _values(resolve_model_defaults(cfg, model)) == before


def test_print_config_shows_resolved_values_and_their_source(tiny_vl, tmp_path, capsys,
                                                             monkeypatch):
    import mmrlvr.train.policy
    import mmrlvr.train.trainer
    from mmrlvr.cli import main

    def no_loading(*args, **kwargs):
        raise AssertionError("--print-config must load no model")

    monkeypatch.setattr(mmrlvr.train.trainer, "train", no_loading)
    monkeypatch.setattr(mmrlvr.train.policy.Policy, "load", no_loading)
    path = tmp_path / "run.yaml"
    path.write_text(f"model: {{path: {tiny_vl}, min_pixels: 784}}\n")
    assert main(["train", "--print-config", str(path), "optim.lr=3e-5"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed["model"]["min_pixels"] == 784 and printed["model"]["max_pixels"] == 12544
    assert printed["rollout"]["max_new_tokens"] == 64 and printed["optim"]["lr"] == 3e-5
    lines = out.splitlines()
    assert "  min_pixels: 784" in lines                            # set: no mark
    assert (f"  max_pixels: 12544  # from {tiny_vl / 'processor_config.json'}: "
            "image_processor.size.longest_edge") in lines
    assert (f"  max_new_tokens: 64  # from {tiny_vl / 'generation_config.json'}: "
            "max_new_tokens") in lines


def test_version_names_mmrlvr_and_the_libraries(capsys):
    tomllib = pytest.importorskip("tomllib")                      # Python 3.11+

    import mmrlvr
    from mmrlvr.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"mmrlvr {mmrlvr.__version__} (python {sys.version.split()[0]}, torch ")
    assert "transformers " in out and len(out.splitlines()) == 1
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == mmrlvr.__version__
