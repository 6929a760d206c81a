"""Synthetic tones data, MMAU/AVQA loaders, and the CPU config end to end (tiny budget)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from mmrlvr.data import DataError, load_jsonl
from mmrlvr.tasks.tones import FAMILIES, load_layout, make_tones
from mmrlvr.methods.audio_rubrics.evidence import order_facts
from mmrlvr.methods.audio_rubrics.judges import numbers_in, order_claims
from rewards.verify import match

CONFIG = Path(__file__).parent.parent / "configs" / "tones_cpu.yaml"


@pytest.fixture(scope="module")
def tones_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tones")
    make_tones(out, n_train=30, n_test=10, seed=1)
    return out


def test_tones_rows_are_balanced_verifiable_and_match_their_evidence(tones_dir):
    train = load_jsonl(tones_dir / "train.jsonl")
    assert Counter(ex.meta["family"] for ex in train) == dict.fromkeys(FAMILIES, 6)
    for ex in train:
        assert Path(ex.audios[0]).is_file() and sf.info(ex.audios[0]).samplerate == 16000
        gold_text = ex.choices[ord(ex.answer) - 65]
        assert match(ex.answer, ex.answer, ex.choices) and match(gold_text, ex.answer, ex.choices)
        assert f"\n{ex.answer}. {gold_text}" in ex.prompt
        p, ev = ex.meta["params"], ex.meta["evidence"][0]
        facts, family = order_facts(ev), ex.meta["family"]
        if family == "count":
            assert ev["onset_count"] == p["beeps"] and gold_text == str(p["beeps"])
        elif family == "pitch":
            assert facts["pitch"] == ("first" if p["f1_hz"] > p["f2_hz"] else "second")
            assert gold_text == f"the {facts['pitch']} tone"
        elif family == "loudness":
            assert gold_text == f"the {facts['loudness']} half"
        elif family == "tempo":
            assert gold_text == ("faster" if facts["tempo"] == "second" else "slower")
        else:
            assert gold_text == ("longer" if facts["duration"] == "second" else "shorter")
        rubrics = ex.meta["rubrics"]
        assert sum(r["weight"] for r in rubrics) == pytest.approx(1.0) and len(rubrics) <= 5
        assert ex.reasoning and ex.answer in "ABCD"
    test = load_jsonl(tones_dir / "test.jsonl")
    assert Counter(ex.meta["family"] for ex in test) == dict.fromkeys(FAMILIES, 2)


def test_reference_reasoning_restates_options_measures_and_ends_on_the_gold_letter(tones_dir):
    """The SFT reference: options restated, measured quantities, a verdict the rubric checks
    read as the true order, then the letter; count rows name only the count."""
    for ex in load_jsonl(tones_dir / "train.jsonl"):
        p, family = ex.meta["params"], ex.meta["family"]
        assert ex.reasoning.endswith(f", so {ex.answer}.")
        facts = order_facts(ex.meta["evidence"][0])
        if family == "count":
            assert ex.reasoning.startswith(f"I hear {p['beeps']} beep")
            assert numbers_in(ex.reasoning) == {p["beeps"]}
            continue
        options = ", ".join(f"{chr(65 + k)} is {c}" for k, c in enumerate(ex.choices))
        assert ex.reasoning.startswith(options + ". ")
        assert order_claims(ex.reasoning) == {(family, facts[family])}
        if family == "pitch":
            assert f"First tone {p['f1_hz']:.0f} Hz, second tone {p['f2_hz']:.0f} Hz." in ex.reasoning


def test_tones_are_seeded(tones_dir, tmp_path):
    make_tones(tmp_path, n_train=30, n_test=10, seed=1)
    assert (tmp_path / "train.jsonl").read_bytes() == (tones_dir / "train.jsonl").read_bytes()
    assert (tmp_path / "audio" / "test-00003.wav").read_bytes() == \
        (tones_dir / "audio" / "test-00003.wav").read_bytes()
    make_tones(tmp_path / "other", n_train=5, n_test=0, seed=2)
    other = (tmp_path / "other" / "train.jsonl").read_text().splitlines()
    assert other != (tones_dir / "train.jsonl").read_text().splitlines()[:5]
    with pytest.raises(ValueError, match="unknown tones families"):
        make_tones(tmp_path / "x", n_train=1, n_test=0, families=["chords"])


def _wav(path):
    sf.write(path, (0.3 * np.sin(np.arange(8000) / 5)).astype(np.float32), 16000)


def test_mmau_and_avqa_layouts_map_onto_examples(tmp_path):
    (tmp_path / "test-mini-audios").mkdir()
    _wav(tmp_path / "test-mini-audios" / "u1.wav")
    mmau = [{"id": "u1", "audio_id": "./test-mini-audios/u1.wav", "question": "Who speaks?",
             "choices": ["Man", "Woman", "Child", "Robot"], "answer": "Woman", "task": "sound",
             "category": "Reasoning", "sub-category": "Acoustic Source Inference", "difficulty": "medium"}]
    (tmp_path / "mmau.json").write_text(json.dumps(mmau))
    [ex] = load_layout(f"mmau:{tmp_path / 'mmau.json'}")
    assert (ex.answer, ex.choices[1], ex.meta["task"], ex.meta["family"]) == ("B", "Woman", "sound", "sound")
    assert ex.prompt == "Who speaks?\nA. Man\nB. Woman\nC. Child\nD. Robot" and Path(ex.audios[0]).is_file()

    _wav(tmp_path / "v9.wav")
    rows = [{"id": 183, "video_name": "v9", "question_text": "What happened in the video?",
             "multi_choice": ["motorboat", "Yacht consignment", "Sailboat set sail", "Consignment car"],
             "answer": 2, "question_type": "Happening", "audio_path": "v9.wav"}]
    (tmp_path / "avqa.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    [ex] = load_layout(f"avqa:{tmp_path / 'avqa.jsonl'}")
    assert (ex.id, ex.answer, ex.choices[2]) == ("avqa-183", "C", "Sailboat set sail")

    mmau[0]["answer"] = "Dog"
    (tmp_path / "bad.json").write_text(json.dumps(mmau))
    with pytest.raises(DataError, match=r"bad\.json, row 1: answer 'Dog'"):
        load_layout(f"mmau:{tmp_path / 'bad.json'}")
    rows[0]["audio_path"] = "gone.wav"
    (tmp_path / "bad.jsonl").write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(DataError, match=r"row 1: audio not found: .*gone\.wav"):
        load_layout(f"avqa:{tmp_path / 'bad.jsonl'}")


def test_cli_converts_a_layout_with_evidence_and_rubrics(tmp_path):
    from mmrlvr.cli import main

    _wav(tmp_path / "a.wav")
    row = {"id": "a", "audio_id": "a.wav", "question": "How many sounds?", "choices": ["1", "2"],
           "answer": "1"}
    (tmp_path / "m.json").write_text(json.dumps([row]))
    spec = f"mmau:{tmp_path / 'm.json'}"
    assert main(["data", "tones", "--from", spec, "--out", str(tmp_path / "out")]) == 0
    [ex] = load_jsonl(tmp_path / "out" / "m.jsonl")
    assert ex.meta["evidence"][0]["onset_count"] == 1 and ex.meta["rubrics"][0]["check"]["kind"] == "count"


def test_cpu_config_runs_sft_then_grpo_with_rubrics_end_to_end(tmp_path, tones_dir):
    """configs/tones_cpu.yaml on a tiny budget: warm start, GRPO, audit log, summary."""
    from mmrlvr.cli import main

    assert main(["tiny", "qwen2-audio", "--out", str(tmp_path / "tiny"), "--corpus",
                 str(tones_dir / "train.jsonl")]) == 0
    cfg = yaml.safe_load(CONFIG.read_text())
    assert cfg["model"]["modality"] == "audio" and cfg["rewards"][0]["name"] == "audio_rubrics"
    cfg["rewards"][0]["log_path"] = str(tmp_path / "grpo" / "rubrics.jsonl")
    cfg["data"].update(train=str(tones_dir / "train.jsonl"), eval=str(tones_dir / "test.jsonl"))
    cfg["sft"].update(init=str(tmp_path / "tiny"), steps=3, batch_size=8, out_dir=str(tmp_path / "sft"))
    cfg["train"].update(steps=2, batch_prompts=2, eval_every=0, save_every=0, eval_batch=10,
                        out_dir=str(tmp_path / "grpo"))
    cfg["model"]["path"] = str(tmp_path / "sft" / "final")
    cfg["rollout"]["max_new_tokens"] = 12
    path = tmp_path / "tones.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["sft", str(path)]) == 0
    assert main(["train", str(path)]) == 0
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    metrics = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert "eval/accuracy" in metrics[0] and "reward/audio_rubrics/rubric" in metrics[-1]
    log = [json.loads(line) for line in (tmp_path / "grpo" / "rubrics.jsonl").read_text().splitlines()]
    assert len(log) == 2 * 2 and {row["progress"] for row in log} == {0.5, 1.0}   # steps 1, 2 of 2
    assert all(len(row["overall"]) == 8 and row["rubrics"] for row in log)
    assert {"accuracy_start", "accuracy_end"} <= set(summary)
