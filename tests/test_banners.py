"""Synthetic banners: deterministic files, valid reference patches, balanced language pairs."""
from __future__ import annotations

import re

import pytest

import rewards
from mmrlvr.cli import main
from mmrlvr.data import load_jsonl
from mmrlvr.patches.schema import parse, validate
from mmrlvr.patches.render import text_width
from mmrlvr.train.sft import sft_target
from mmrlvr.tasks.banners import PAIRS, PHRASES, make_banners
from mmrlvr.methods.transanytext.reward import extract_patch


@pytest.fixture(scope="module")
def banners(tmp_path_factory):
    out = tmp_path_factory.mktemp("banners")
    make_banners(out, n_train=8, n_test=4, seed=0)
    return out


def test_the_phrase_table_covers_three_pairs_including_a_non_latin_script():
    assert len(PAIRS) >= 3 and "en-ru" in PAIRS
    langs = {lang for pair in PAIRS for lang in pair.split("-")}
    for role, entries in PHRASES.items():
        for entry in entries:
            assert langs <= set(entry), (role, entry)
            assert len({len(re.findall(r"\{\w\}", entry[lang])) for lang in langs}) == 1, entry
    assert all(re.search(r"[\u0400-\u04FF]", e["ru"]) for es in PHRASES.values() for e in es
               if not re.fullmatch(r"[-{}p% ]+", e["ru"]))


def test_same_arguments_give_byte_identical_files(banners, tmp_path):
    make_banners(tmp_path, n_train=8, n_test=4, seed=0)
    for name in ("train.jsonl", "test.jsonl", "images/train-00005.png", "images/test-00003.png"):
        assert (tmp_path / name).read_bytes() == (banners / name).read_bytes(), name
    make_banners(tmp_path / "other", n_train=8, n_test=0, seed=1)
    assert (tmp_path / "other" / "train.jsonl").read_bytes() != (banners / "train.jsonl").read_bytes()


def test_rows_hold_valid_reference_patches_that_score_one(banners):
    rows = load_jsonl(banners / "train.jsonl") + load_jsonl(banners / "test.jsonl")
    assert [r.meta["pair"] for r in rows[:8]] == list(PAIRS) * 2          # dealt in turn
    reward = rewards.get("translation")
    for ex in rows:
        target, source = parse(ex.answer), parse(ex.meta["source_patch"])
        validate(target, 224, 112)
        assert [(b.x, b.y, b.w, b.h) for b in target.boxes] == [(b.x, b.y, b.w, b.h) for b in source.boxes]
        for t, s in zip(target.boxes, source.boxes):
            assert text_width(t) <= t.w and text_width(s) <= s.w and t.size <= s.size
        assert ex.meta["target_lang"] in ex.meta["pair"] and "into" in ex.prompt
        completion = sft_target(ex)
        assert extract_patch(completion) == ex.answer
        assert reward.score(ex, [completion])[0]["overall"] == pytest.approx(1.0)
        assert all(b.text in ex.reasoning for b in source.boxes)
    assert any(re.search(r"[\u0400-\u04FF]", ex.answer) for ex in rows if ex.meta["pair"] == "en-ru")


def test_the_cli_writes_a_banners_dataset(tmp_path, capsys):
    assert main(["data", "banners", "--out", str(tmp_path), "--n-train", "2", "--n-test", "1",
                 "--image-size", "56", "--families", "en-ru,en-de"]) == 0
    rows = load_jsonl(tmp_path / "train.jsonl")
    assert [r.meta["pair"] for r in rows] == ["en-ru", "en-de"]
    assert parse(rows[0].answer).width == 112
    with pytest.raises(ValueError, match="unknown language pair"):
        make_banners(tmp_path / "bad", n_train=1, n_test=0, pairs=["en-xx"])


def test_compact_banners_hold_the_same_patches_in_fewer_characters(banners, tmp_path):
    make_banners(tmp_path, n_train=8, n_test=0, seed=0, compact=True)
    full, compact = load_jsonl(banners / "train.jsonl"), load_jsonl(tmp_path / "train.jsonl")
    reward = rewards.get("translation")
    for a, b in zip(full, compact):
        assert parse(b.answer).boxes == parse(a.answer).boxes
        assert parse(b.meta["source_patch"]).boxes == parse(a.meta["source_patch"]).boxes
        assert b.answer.startswith("<p ") and len(b.answer) * 2.5 < len(a.answer)
        assert "<p>" in b.prompt and "<div>" in a.prompt
        assert reward.score(b, [sft_target(b)])[0]["overall"] == pytest.approx(1.0)
        assert reward.score(a, [f"<answer>{b.answer}</answer>"])[0]["overall"] == pytest.approx(1.0)
    assert (tmp_path / "images" / "train-00003.png").read_bytes() == \
        (banners / "images" / "train-00003.png").read_bytes()
