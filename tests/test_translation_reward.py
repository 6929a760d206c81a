"""The translation reward on hand-made patches: each component moves the way it should."""
from __future__ import annotations

import pytest

import rewards
from mmrlvr.data import Example
from mmrlvr.patches.schema import Patch, TextBox, to_html
from rewards.base import build_combined
from mmrlvr.methods.transanytext.reward import extract_patch, match_boxes

REF = Patch([TextBox("Sommerschlussverkauf", 10, 8, 200, 30, 20, weight=700, color=(200, 30, 30),
                     align="center"),
             TextBox("Jetzt kaufen", 10, 60, 200, 24, 14, color=(20, 20, 20))], 224, 112)
EX = Example(id="b1", prompt="translate", answer=to_html(REF), meta={"width": 224, "height": 112})


def wrap(patch: Patch | str) -> str:
    body = patch if isinstance(patch, str) else to_html(patch)
    return f"<think>2 boxes.</think><answer>{body}</answer>"


def with_box(i: int, **changes) -> Patch:
    from dataclasses import replace

    boxes = list(REF.boxes)
    boxes[i] = replace(boxes[i], **changes)
    return Patch(boxes, REF.width, REF.height)


def score(*completions: str, **options) -> list[dict]:
    return rewards.get("translation", **options).score(EX, list(completions))


def test_a_perfect_patch_scores_one_on_every_component():
    (s,) = score(wrap(REF))
    for key in ("format", "position", "translation", "style", "overall"):
        assert s[key] == pytest.approx(1.0), key
    assert s["parse_fail"] == 0.0
    # box order and a different canvas size do not matter
    shuffled = Patch(list(reversed(REF.boxes)), REF.width, REF.height).scaled(448, 224)
    assert score(wrap(shuffled))[0]["overall"] == pytest.approx(1.0, abs=1e-6)


def test_a_shifted_box_lowers_position_only():
    (s,) = score(wrap(with_box(1, y=72)))                     # 12 px down, box 24 px tall
    inter = 200 * 12
    expected_iou = inter / (2 * 200 * 24 - inter)
    assert s["position"] == pytest.approx((1 + expected_iou) / 2)
    assert s["translation"] == pytest.approx(1.0) and s["style"] == pytest.approx(1.0)
    assert s["overall"] == pytest.approx(0.1 + 0.3 * s["position"] + 0.4 + 0.2)


def test_wrong_colour_size_and_weight_lower_style():
    (colour,) = score(wrap(with_box(0, color=(30, 30, 200))))
    (size,) = score(wrap(with_box(0, size=15)))
    (weight,) = score(wrap(with_box(0, weight=400)))
    for s in (colour, size, weight):
        assert s["style"] < 1.0 and s["position"] == pytest.approx(1.0)
    dist = ((170 ** 2) * 2) ** 0.5 / (255 * 3 ** 0.5)
    assert colour["style"] == pytest.approx((1 + (1 - dist + 1 + 1) / 3) / 2)
    assert size["style"] == pytest.approx((1 + (1 + 0.75 + 1) / 3) / 2)
    assert weight["style"] == pytest.approx((1 + 2 / 3) / 2)


def test_wrong_text_lowers_translation_and_a_missing_box_lowers_position():
    (wrong,) = score(wrap(with_box(0, text="Wintermantel")))
    assert wrong["translation"] < 0.7 and wrong["position"] == pytest.approx(1.0)
    (missing,) = score(wrap(Patch(REF.boxes[:1], 224, 112)))
    assert missing["position"] == pytest.approx(0.5) and missing["style"] == pytest.approx(0.5)


def test_an_unparsable_patch_scores_zero_and_is_counted():
    reward = rewards.get("translation")
    bad = ["<think>x</think><answer><div>no style</div></answer>", "no patch at all",
           "<think>x</think><answer>" + to_html(REF), ""]
    out = reward.score(EX, bad + [wrap(REF)])
    for s in out[:4]:
        assert s["overall"] == 0.0 and s["parse_fail"] == 1.0 and s["format"] == 0.0
    assert out[4]["overall"] == pytest.approx(1.0)
    assert reward.failures == 4
    assert set(out[0]) == set(out[4])                         # same keys: every component is logged


def test_weights_come_from_the_config():
    combined = build_combined([{"name": "translation", "weight": 1.0,
                                "weights": {"format": 0.0, "position": 1.0, "translation": 0.0,
                                            "style": 0.0}}])
    (s,) = combined.score(EX, [wrap(with_box(1, y=72))])
    assert s["overall"] == pytest.approx(s["translation/position"])
    with pytest.raises(ValueError, match="unknown weights"):
        rewards.get("translation", weights={"layout": 1.0})


def test_the_patch_comes_from_the_last_answer_block():
    assert extract_patch("<think>a</think><answer>P</answer>") == "P"
    assert extract_patch("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_patch("<div>raw</div>") == "<div>raw</div>"
    assert extract_patch("<answer>unclosed") is None
    pairs = match_boxes(list(reversed(REF.boxes)), REF.boxes)
    assert sorted((i, j) for i, j, _ in pairs) == [(0, 1), (1, 0)]


def test_a_patch_with_an_absurd_font_size_scores_zero_instead_of_crashing():
    from mmrlvr.patches.render import RenderError, render_layer

    giant = with_box(0, size=40000)                            # a sampled typo: s=40000
    with pytest.raises(RenderError, match="box 1: font-size 40000px"):
        render_layer(giant, (224, 112))
    (s,) = score(wrap(giant))
    assert s["overall"] == 0.0 and s["format"] == 0.0
