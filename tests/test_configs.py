"""Every shipped config parses; the GPU recipe's data layout loads from a local fixture."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from mmrlvr.config import load_config
from mmrlvr.data import load_dataset

CONFIGS = sorted((Path(__file__).parent.parent / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_parses(path):
    cfg = load_config(path)
    assert cfg.train.steps > 0 and cfg.rollout.group_size >= 2


def test_geo3k_recipe_matches_the_reference_setup_and_loads_its_layout(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = load_config(CONFIGS[0].parent / "geo3k_qwen25vl7b.yaml")
    assert (cfg.optim.lr, cfg.rollout.group_size, cfg.rollout.temperature) == (1e-6, 12, 1.0)
    assert cfg.model.freeze_vision
    layout, _, _ = cfg.data.train.partition(":")
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, format="PNG")
    table = pa.table({
        "images": [[{"bytes": buf.getvalue(), "path": "a.png"}], [{"bytes": buf.getvalue(), "path": "b.png"}]],
        "problem": ["<image>Find x. Round to the nearest tenth.", "<image>Find the area."],
        "answer": ["7.2", "\\frac{3}{2}"],
    })
    pq.write_table(table, tmp_path / "train.parquet")
    examples = load_dataset(f"{layout}:{tmp_path / 'train.parquet'}")
    assert [e.answer for e in examples] == ["7.2", "\\frac{3}{2}"]
    assert examples[0].prompt == "Find x. Round to the nearest tenth."
    assert Image.open(examples[1].images[0]).size == (64, 48)


def test_cpu_runs_never_import_vllm(tmp_path):
    """The vLLM backend is a GPU-only extra: importing the core must not pull it in."""
    import subprocess
    import sys

    code = ("import sys, mmrlvr.train.trainer, mmrlvr.rollout, mmrlvr.cli, modalities.vision; "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
