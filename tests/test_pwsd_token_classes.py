"""PWSD per token class (style, layout, text, other): the character classes of a patch, their
tokens under a real tokenizer, and the per-class figures of a PWSD step on a tiny policy, both
from the objective and in a trainer run's metrics.jsonl."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from PIL import Image

from mmrlvr.methods.transanytext.token_classes import (CLASSES, LAYOUT, OTHER, STYLE, TEXT,
                                                       char_classes, class_stats, token_classes)
from mmrlvr.patches.render import render_patch
from mmrlvr.patches.schema import Patch, TextBox, to_compact, to_html

SOURCE = Patch([TextBox("Summer Sale", 6, 4, 100, 20, 14, weight=700, color=(255, 255, 255)),
                TextBox("up to half off", 6, 30, 100, 16, 10, color=(20, 20, 20), align="right")],
               112, 56)
TARGET = Patch([TextBox("Sommerschlussverkauf", 6, 4, 100, 20, 12, weight=700, color=(255, 255, 255)),
                TextBox("bis zur Haelfte", 6, 30, 100, 16, 10, color=(20, 20, 20), align="right")],
               112, 56)


def labels_by_hand(text: str, pieces: list[tuple[str, int]]) -> list[int]:
    """Class per character: OTHER, except each listed piece (found left to right) as given."""
    out, at = [OTHER] * len(text), 0
    for piece, code in pieces:
        at = text.index(piece, at)
        out[at:at + len(piece)] = [code] * len(piece)
        at += len(piece)
    return out


def canonical_pieces(patch: Patch) -> list[tuple[str, int]]:
    out = [(f"width:{patch.width}px", LAYOUT), (f"height:{patch.height}px", LAYOUT)]
    for b in patch.boxes:
        out += [(f"left:{b.x:g}px", LAYOUT), (f"top:{b.y:g}px", LAYOUT), (f"width:{b.w:g}px", LAYOUT),
                (f"height:{b.h:g}px", LAYOUT), (f"font-family:'{b.font}'", STYLE),
                (f"font-size:{b.size:g}px", STYLE), (f"font-weight:{b.weight}", STYLE),
                ("color:#{:02x}{:02x}{:02x}".format(*b.color), STYLE),
                (f"text-align:{b.align}", LAYOUT), ("direction:ltr", LAYOUT), (b.text, TEXT)]
    return out


COMPACT_PIECES = [("x=6", LAYOUT), ("y=4", LAYOUT), ("w=100", LAYOUT), ("h=20", LAYOUT),
                  ("s=12", STYLE), ("b", STYLE), ("c=ffffff", STYLE), ("Sommerschlussverkauf", TEXT),
                  ("x=6", LAYOUT), ("y=30", LAYOUT), ("w=100", LAYOUT), ("h=16", LAYOUT),
                  ("s=10", STYLE), ("c=141414", STYLE), ("a=r", LAYOUT), ("bis zur Haelfte", TEXT)]


def test_characters_of_a_canonical_patch_take_their_class():
    text = "<think>two boxes</think><answer>" + to_html(TARGET, indent=True) + "</answer>"
    assert char_classes(text).tolist() == labels_by_hand(text, canonical_pieces(TARGET))


def test_characters_of_a_compact_and_of_a_cut_patch_take_their_class():
    text = "<answer>" + to_compact(TARGET) + "</answer>"
    assert "<p x=6 y=4 w=100 h=20 s=12 b c=ffffff>Sommerschlussverkauf</p>" in text
    assert char_classes(text).tolist() == labels_by_hand(text, COMPACT_PIECES)
    cut = '<div style="left:6px;top:4px;wid'                      # a rollout stopped mid-box
    assert char_classes(cut).tolist() == labels_by_hand(cut, [("left:6px", LAYOUT),
                                                              ("top:4px", LAYOUT)])
    assert set(char_classes("no patch at all").tolist()) == {OTHER}


@pytest.fixture(scope="module")
def translation_policy(tiny_vl):
    import modalities
    from mmrlvr.config import ModelConfig
    from mmrlvr.train.policy import Policy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    return Policy.load(ModelConfig(path=str(tiny_vl), modality="image_translation"),
                       modalities.get("image_translation"), torch.device("cpu"))


def test_tokens_take_the_class_of_most_of_their_characters(translation_policy):
    tok = translation_policy.tokenizer
    text = to_compact(TARGET)
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id, tok.eos_token_id]
    mask = torch.tensor([[1] * (len(ids) - 1) + [0]])              # the last EOS is padding
    got = token_classes(tok, torch.tensor([ids]), mask)[0].tolist()
    chars = labels_by_hand(text, COMPACT_PIECES)
    at, expected = 0, []
    for i in ids[:-2]:                                             # ASCII: tokens decode alone
        piece = tok.decode([i])
        counts = [0, 0, 0, 0]
        for c, code in zip(piece, chars[at:at + len(piece)]):
            counts[code] += not c.isspace()
        expected.append(counts.index(max(counts)) if any(counts) else OTHER)
        at += len(piece)
    assert at == len(text) and got == expected + [OTHER, OTHER]   # EOS and padding: other
    assert {TEXT, STYLE, LAYOUT, OTHER} <= set(got)
    text_tokens = "".join(tok.decode([i]) for i, c in zip(ids, got) if c == TEXT)
    assert "Sommerschlussverkauf" in text_tokens.replace(">", "")


def write_banners(out, n: int = 2) -> None:
    """A banners-like JSONL (DejaVu fonts only), half canonical HTML, half compact patches."""
    from modalities.image_translation import instruction

    (out / "images").mkdir(parents=True)
    rows = []
    for i in range(n):
        compact = bool(i % 2)
        render_patch(SOURCE, Image.new("RGB", (112, 56), (60 + 40 * i, 90, 160))).save(
            out / "images" / f"b{i}.png")
        form = to_compact if compact else to_html
        rows.append({"id": f"b{i}", "prompt": instruction("de", compact=compact),
                     "answer": form(TARGET), "images": [f"images/b{i}.png"],
                     "meta": {"source_patch": form(SOURCE), "width": 112, "height": 56,
                              "source_lang": "en", "target_lang": "de"}})
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def force_reference_completions(monkeypatch):
    """The hf engine's rollouts with every completion replaced by its row's reference patch
    (a random tiny model writes none, and the classes need one), plus EOS."""
    from mmrlvr.rollout.hf import HFRolloutEngine

    real = HFRolloutEngine.generate

    def generate(self, batch, params):
        out = real(self, batch, params)
        tok = self.policy.tokenizer
        texts = [f"<answer>{out.example_of(r).answer}</answer>" for r in range(len(out.texts))]
        ids = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
        width = max(map(len, ids))
        pad = torch.tensor([row + [tok.eos_token_id] * (width - len(row)) for row in ids])
        mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
        return dataclasses.replace(out, completion_ids=pad, completion_mask=mask, texts=texts,
                                   sample_logprobs=None)

    monkeypatch.setattr(HFRolloutEngine, "generate", generate)


def test_per_class_stats_decompose_the_pwsd_loss_on_a_tiny_policy(translation_policy, tmp_path,
                                                                  monkeypatch):
    from mmrlvr.data import load_jsonl
    from mmrlvr.methods.transanytext.pwsd import PWSD, pwsd_loss
    from mmrlvr.objectives import StepContext
    from mmrlvr.rollout import make_engine
    from mmrlvr.rollout.base import SamplingParams

    write_banners(tmp_path)
    policy = translation_policy
    force_reference_completions(monkeypatch)
    batch = policy.adapter.encode(load_jsonl(tmp_path / "train.jsonl"), policy.processor)
    rollouts = make_engine("hf", policy).generate(batch, SamplingParams(n=2, max_new_tokens=2))
    objective = PWSD()
    with torch.no_grad():
        loss, stats = objective.loss(StepContext(policy, rollouts, [], torch.zeros(4), 1, 1))
        inputs = objective.prepare(policy, rollouts, [0, 1, 2, 3])
        ids, mask = inputs["ids"], inputs["mask"]
        student = policy.vocab_logprobs(policy.training_inputs(inputs["student"], ids, mask), ids.shape[1])
        teacher = policy.vocab_logprobs(policy.training_inputs(inputs["teacher"], ids, mask), ids.shape[1])
        plain, st = pwsd_loss(student, teacher, ids, mask)
    assert float(loss) == float(plain)                             # the classes leave the loss alone
    classes = token_classes(policy.tokenizer, ids, mask)
    m = mask.float()
    for code, name in enumerate(CLASSES):
        sel = (classes == code).float() * m
        assert stats[f"{name}/token_frac"] == pytest.approx(float(sel.sum() / m.sum()), rel=1e-6)
        assert stats[f"{name}/weight_mean"] == pytest.approx(
            float((torch.sigmoid(st["gap"]) * sel).sum() / sel.sum()), rel=1e-5)
        assert stats[f"{name}/gap_mean"] == pytest.approx(float((st["gap"] * sel).sum() / sel.sum()),
                                                          rel=1e-5, abs=1e-7)
    assert sum(stats[f"{c}/token_frac"] for c in CLASSES) == pytest.approx(1.0)
    assert sum(stats[f"{c}/token_frac"] * stats[f"{c}/loss"] for c in CLASSES) == \
        pytest.approx(float(loss), rel=1e-5)
    assert stats["text/token_frac"] > 0.05 and stats["layout/token_frac"] > 0.05 \
        and stats["style/token_frac"] > 0.05


def test_class_stats_leave_out_a_class_without_tokens():
    classes = torch.tensor([[TEXT, TEXT, STYLE]])
    mask = torch.tensor([[1, 1, 0]])
    out = class_stats(classes, mask, torch.zeros(1, 3), torch.full((1, 3), 0.5), torch.ones(1, 3))
    assert out == {"text/token_frac": 1.0, "text/gap_mean": 0.0, "text/weight_mean": 0.5,
                   "text/loss": 0.5}


def test_a_pwsd_step_logs_the_per_class_figures_to_metrics_jsonl(tmp_path, tiny_vl, monkeypatch):
    from test_metrics_doc import undocumented
    from test_pwsd import one_pwsd_step

    torch.set_num_threads(1)
    write_banners(tmp_path / "data")
    force_reference_completions(monkeypatch)
    row = one_pwsd_step(tmp_path, tiny_vl, tmp_path / "data", 1.0, {})
    assert row["reward/translation/parse_fail"] == 0.0              # the rollouts hold the patches
    keys = [f"objective/pwsd/{c}/{s}" for c in ("style", "layout", "text", "other")
            for s in ("token_frac", "gap_mean", "weight_mean", "loss")]
    assert set(keys) <= set(row)
    assert sum(row[f"objective/pwsd/{c}/token_frac"] for c in CLASSES) == pytest.approx(1.0)
    assert sum(row[f"objective/pwsd/{c}/token_frac"] * row[f"objective/pwsd/{c}/loss"]
               for c in CLASSES) == pytest.approx(row["objective/pwsd"], rel=1e-5)
    assert undocumented(row) == []
