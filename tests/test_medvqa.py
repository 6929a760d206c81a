"""Synthetic medical VQA and the VQA-RAD / SLAKE / PathVQA / JSONL loaders."""
from __future__ import annotations

import io
import json
import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from mmrlvr.data import DataError, Example, load_dataset, load_jsonl
from mmrlvr.tasks.medvqa_public import convert, load_any, load_pathvqa, load_slake, load_vqarad
from mmrlvr.core.templates import split_options
from mmrlvr.tasks.medvqa import FAMILIES, Study, make_medvqa
from rewards.verify import detect_kind, match


def test_make_medvqa_is_deterministic_and_every_gold_verifies(tmp_path):
    infos = [make_medvqa(tmp_path / d, n_train=22, n_test=11, seed=3, image_size=56) for d in "ab"]
    assert infos[0] == infos[1]
    for name in ("train.jsonl", "test.jsonl", "images/test-000004.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    train = load_jsonl(tmp_path / "a" / "train.jsonl")
    assert Counter(ex.meta["family"] for ex in train) == dict.fromkeys(FAMILIES, 2)
    assert len({Image.open(ex.images[0]).tobytes() for ex in train}) == len(train)
    for ex in train + load_jsonl(tmp_path / "a" / "test.jsonl"):
        family = ex.meta["family"]
        assert ex.meta["answer_type"] == FAMILIES[family][1] and ex.reasoning
        assert match(ex.answer, ex.answer, ex.choices)
        if ex.choices:
            assert split_options(ex.prompt, ex.choices)[1] and len(ex.answer) == 1
            assert ex.meta["answer_type"] == "closed"
        else:
            closed = detect_kind(ex.answer) == "yesno"
            assert closed == (ex.meta["answer_type"] == "closed"), ex
        assert Image.open(ex.images[0]).size == (56, 56)


@pytest.mark.parametrize("modality, organ, plane", [
    ("xray", "lung", "coronal"), ("ct", "lung", "axial"), ("mri", "lung", "coronal"),
    ("ct", "brain", "axial"), ("mri", "brain", "coronal")])
def test_a_left_lesion_is_drawn_on_the_image_right(modality, organ, plane):
    """Radiological convention: the patient's left is on the image's right."""
    for side, bright_half in (("left", "right"), ("right", "left")):
        clean = np.asarray(Study(modality, organ, plane, (), "large", seed=7).render(112), float)
        sick = np.asarray(Study(modality, organ, plane, (side,), "large", seed=7).render(112), float)
        lesion = (sick - clean) > 45                     # texture noise differs by ~10 grey levels
        left, right = lesion[:, :56].sum(), lesion[:, 56:].sum()
        assert (right if bright_half == "right" else left) > 100
        assert (left if bright_half == "right" else right) < 15


def _jpg(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (32, 32), 90).save(path)


def test_loaders_read_the_public_layouts(tmp_path):
    rad = tmp_path / "VQA_RAD"
    _jpg(rad / "VQA_RAD Image Folder" / "synpic1.jpg")
    rows = [{"qid": 1, "image_name": "synpic1.jpg", "image_organ": "CHEST", "answer": "Yes",
             "answer_type": "CLOSED", "question_type": "PRES", "question": "Is there a mass?",
             "phrase_type": "freeform"},
            {"qid": 2, "image_name": "synpic1.jpg", "image_organ": "CHEST", "answer": "left lung",
             "answer_type": "OPEN", "question_type": "POS", "question": "Where is the mass?",
             "phrase_type": "test_freeform"}]
    (rad / "VQA_RAD Dataset Public.json").write_text(json.dumps(rows))
    got = load_vqarad(rad)
    assert [(e.id, e.answer, e.meta["answer_type"], e.meta["split"]) for e in got] == [
        ("vqarad-1", "Yes", "closed", "train"), ("vqarad-2", "left lung", "open", "test")]
    assert [e.id for e in load_any(f"vqarad:{rad}", split="test")] == ["vqarad-2"]

    slake = tmp_path / "Slake1.0"
    _jpg(slake / "imgs" / "xmlab1" / "source.jpg")
    base = {"img_name": "xmlab1/source.jpg", "answer_type": "OPEN", "modality": "CT",
            "location": "Abdomen", "content_type": "Organ"}
    (slake / "test.json").write_text(json.dumps([
        {**base, "qid": 7, "question": "Which organ is shown?", "answer": "Liver", "q_lang": "en"},
        {**base, "qid": 8, "question": "图中是什么器官?", "answer": "肝脏", "q_lang": "zh"}]))
    [ex] = load_slake(slake)
    assert (ex.id, ex.answer, ex.meta["answer_type"]) == ("slake-7", "Liver", "open")
    assert ex.meta["modality"] == "CT"

    path = tmp_path / "pvqa"
    _jpg(path / "images" / "train" / "train_0001.jpg")
    (path / "qas" / "train").mkdir(parents=True)
    with (path / "qas" / "train" / "train_qa.pkl").open("wb") as fh:
        pickle.dump([{"image": "train_0001", "question": "Is this tissue normal?", "answer": "no"}], fh)
    [ex] = load_pathvqa(path)
    assert ex.answer == "no" and ex.meta["answer_type"] == "closed" and ex.meta["split"] == "train"
    with (path / "qas" / "train" / "train_qa.pkl").open("wb") as fh:
        pickle.dump([Example(id="x", prompt="q", answer="a")], fh)
    with pytest.raises(DataError, match="refusing to unpickle"):
        load_pathvqa(path)

    buf = io.BytesIO()
    Image.new("RGB", (20, 20), (200, 10, 10)).save(buf, format="PNG")
    hf = tmp_path / "path-vqa" / "data"
    hf.mkdir(parents=True)
    pq.write_table(pa.table({"image": [{"bytes": buf.getvalue(), "path": "a.png"}] * 2,
                             "question": ["Is this benign?", "What stain is used?"],
                             "answer": ["yes", "h&e"]}), hf / "test-00000-of-00001.parquet")
    got = load_any(f"pathvqa:{hf.parent}")
    assert [(e.answer, e.meta["answer_type"], e.meta["split"]) for e in got] == [
        ("yes", "closed", "test"), ("h&e", "open", "test")]
    assert Image.open(got[0].images[0]).size == (20, 20)

    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"id": "p", "prompt": "Which side?", "answer": "A",
                                 "choices": ["left", "right"]}) + "\n")
    assert load_any(str(plain))[0].meta["answer_type"] == "closed"

    info = convert(f"vqarad:{rad}", tmp_path / "converted")
    assert info["splits"] == {"test": {"rows": 1, "closed": 0}, "train": {"rows": 1, "closed": 1}}
    [row] = load_dataset(tmp_path / "converted" / "train.jsonl")
    assert row.prompt == "Is there a mass?" and Image.open(row.images[0]).size == (32, 32)
    with pytest.raises(DataError, match="slake"):
        load_slake(tmp_path / "empty")


def test_cli_data_medvqa_synthesises_and_converts(tmp_path):
    from mmrlvr.cli import main

    assert main(["data", "medvqa", "--out", str(tmp_path / "syn"), "--n-train", "3", "--n-test", "2",
                 "--image-size", "56", "--families", "organ,side_mc"]) == 0
    rows = load_jsonl(tmp_path / "syn" / "train.jsonl")
    assert len(rows) == 3 and {r.meta["family"] for r in rows} == {"organ", "side_mc"}
    assert main(["data", "medvqa", "--from", f"vqarad:{tmp_path / 'nothing'}", "--out",
                 str(tmp_path / "x")]) == 2
