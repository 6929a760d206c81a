"""`mmrlvr translate`: erase, patch, compose — by hand and end to end on a tiny model."""
from __future__ import annotations

import json

import numpy as np
from PIL import Image

from mmrlvr.cli import main
from mmrlvr.patches.schema import Patch, TextBox
from mmrlvr.patches.render import render_patch
from mmrlvr.translate import compose, output_paths

BG = (88, 160, 214)
SOURCE = Patch([TextBox("Summer Sale", 10, 10, 200, 36, 24, weight=700, color=(255, 255, 255),
                        align="center")], 224, 112)
TARGET = Patch([TextBox("Soldes d'été", 10, 10, 200, 36, 24, weight=700, color=(255, 255, 255),
                        align="center")], 224, 112)


def test_compose_erases_the_source_text_and_draws_the_patch():
    clean = Image.new("RGB", (224, 112), BG)
    image = render_patch(SOURCE, clean)
    erased, layer, final = compose(image, TARGET, erase_boxes=SOURCE)
    assert np.abs(np.asarray(erased, int) - np.asarray(clean, int)).max() <= 8
    expected = render_patch(TARGET, erased)
    assert np.array_equal(np.asarray(final), np.asarray(expected))
    assert layer.mode == "RGBA" and np.asarray(layer)[:, :, 3].max() == 255
    # without the source patch the predicted boxes (same layout) say where to erase
    erased2, _, _ = compose(image, TARGET)
    assert np.abs(np.asarray(erased2, int) - np.asarray(clean, int)).max() <= 8


def test_translate_runs_end_to_end_on_a_tiny_model(tmp_path, tiny_vl, capsys):
    clean = Image.new("RGB", (224, 112), BG)
    render_patch(SOURCE, clean).save(tmp_path / "in.png")
    out = tmp_path / "out" / "fr.png"
    assert main(["translate", "--model", str(tiny_vl), "--image", str(tmp_path / "in.png"),
                 "--lang", "fr", "--out", str(out), "--max-new-tokens", "8", "--device", "cpu"]) == 0
    paths = output_paths(out)
    for key in ("final", "erased", "layer"):
        assert Image.open(paths[key]).size == (224, 112), key
    result = json.loads(paths["json"].read_text())
    assert result["lang"] == "fr" and result["parse_error"]        # random weights: no patch
    assert "did not parse" in capsys.readouterr().err
    source = np.asarray(Image.open(tmp_path / "in.png"))
    assert np.array_equal(np.asarray(Image.open(paths["final"])), source)     # nothing to draw
    assert np.array_equal(np.asarray(Image.open(paths["erased"])), source)
