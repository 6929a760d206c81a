"""`mmrlvr stress`: operators keep the gold (or say they change the task); figures recompute."""
from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from mmrlvr.data import Example, load_jsonl
from mmrlvr.core.stats import mcnemar_exact
from mmrlvr.stress.run import paired_metrics, run_stress, summarize, write_report
from mmrlvr.stress import OPERATORS, apply, gold_index
from mmrlvr.stress.ops import FORMAT_INSTRUCTIONS, PARAPHRASES, gold_preserved, paraphrase
from mmrlvr.stress.ops_video import operators as video_operators
from mmrlvr.core.templates import HELDOUT_TEMPLATES, split_options
from rewards.verify import extract_answer, match

FMT = FORMAT_INSTRUCTIONS[0]
VIDEO_OPS = set(video_operators())
HAND = [
    Example(id="h1", prompt="Which lobe is involved?\nA. upper\nB. lower\nC. middle", answer="upper",
            choices=["upper", "lower", "middle"]),                 # gold given as option text
    Example(id="h2", prompt="Pick one: a, b or c?", answer="C", choices=["a", "b", "c"]),  # not listed
    Example(id="h3", prompt="Is there a fracture?", answer="no", meta={"answer_type": "closed"}),
]


@pytest.fixture(scope="module")
def med(tmp_path_factory):
    from mmrlvr.tasks.medvqa import make_medvqa

    out = tmp_path_factory.mktemp("med-stress")
    make_medvqa(out, n_train=0, n_test=33, image_size=56)
    return load_jsonl(out / "test.jsonl")


def test_paraphrase_rules_match_their_reviewed_examples(med):
    for _, _, before, after in PARAPHRASES:
        assert paraphrase(before) == after
    assert paraphrase("Describe the scan.") is None
    for ex in med:                                  # every synthetic question has a rule
        assert paraphrase(split_options(ex.prompt, ex.choices)[0]) is not None, ex.prompt


def test_every_operator_keeps_the_gold_or_is_marked_task_altering(med):
    applied = Counter()
    for ex in med + HAND:
        for name, op in OPERATORS.items():
            variant = apply(op, ex, FMT, seed=0)
            if variant is None:
                continue
            applied[name] += 1
            new = variant.example
            assert apply(op, ex, FMT, seed=0).example.prompt == new.prompt      # seeded
            if op.kind == "task":
                assert new.choices is None and new.answer == ex.choices[gold_index(ex)]
                assert new.meta["answer_type"] == "open" and new.prompt in ex.prompt
                continue
            assert gold_preserved(ex, new)
            if new.choices:
                right = new.choices[gold_index(new)]
                assert match(right, new.answer, new.choices)                   # still verifiable
                assert right == ex.choices[gold_index(ex)]
            else:
                assert new.answer == ex.answer
            if op.kind == "image":
                assert new.prompt == ex.prompt and isinstance(new.images[0], Image.Image)
                assert new.images[0].size == Image.open(ex.images[0]).size
                continue
            assert new.images == ex.images
            if name == "option_shuffle":
                stem, listed = split_options(new.prompt, new.choices)
                assert listed and stem == split_options(ex.prompt, ex.choices)[0]
                assert gold_index(new) != gold_index(ex)                          # the gold moved
                assert ex.answer == "upper" or not match(ex.answer, new.answer, new.choices)
            if name == "template_swap":
                assert any(new.prompt == t.replace("{question}", ex.prompt) for t in HELDOUT_TEMPLATES)
            if name == "format_instruction":
                assert variant.format_prompt in FORMAT_INSTRUCTIONS and variant.format_prompt != FMT
            else:
                assert variant.format_prompt == FMT
    assert set(applied) == {n for n, op in OPERATORS.items()
                            if op.kind != "audio" and n not in VIDEO_OPS}   # no audio, no video
    mc = sum(1 for ex in med + HAND if ex.choices)
    assert applied["option_shuffle"] == applied["mc_to_open"] == mc - 1    # h2 lists no options
    assert applied["gaussian_noise"] == len(med)                           # h* have no image


def test_mcnemar_and_paired_metrics_on_hand_values():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 0) == pytest.approx(2 / 32)
    assert mcnemar_exact(3, 1) == pytest.approx(2 * 5 / 16)
    assert mcnemar_exact(4, 4) == 1.0
    m = paired_metrics([1, 1, 1, 1, 0, 0], [1, 0, 0, 1, 0, 1], n_boot=500, seed=0)
    assert (m["n"], m["broke"], m["fixed"]) == (6, 2, 1)
    assert m["clean_accuracy"] == pytest.approx(4 / 6) and m["accuracy"] == pytest.approx(3 / 6)
    assert m["drop"] == pytest.approx(100 / 6) and m["flip_rate"] == 0.5
    assert m["mcnemar_p"] == 1.0
    lo, hi = m["drop_ci95"]
    assert lo <= m["drop"] <= hi and lo < 0 < hi


def _binomial_p(b: int, c: int) -> float:
    """Exact two-sided binomial p: total mass of outcomes no likelier than the observed one."""
    n = b + c
    pmf = [math.comb(n, k) / 2 ** n for k in range(n + 1)]
    return min(1.0, sum(p for p in pmf if p <= pmf[b] * (1 + 1e-12)))


class _Scripted:
    """A stand-in policy + engine: right or wrong by a hash of what it was asked (deterministic)."""

    adapter = processor = None

    def __init__(self):
        self.adapter = self

    def encode(self, examples, processor, system_prompt="", format_prompt=""):
        return SimpleNamespace(examples=examples, fmt=format_prompt)

    def generate(self, batch, params):
        texts = []
        for ex in batch.examples:
            h = int(hashlib.sha1((ex.prompt + batch.fmt + str(len(ex.images))).encode()).hexdigest(), 16)
            ans = ex.answer if h % 3 else "zzz"
            texts.append(f"<think>looked</think><answer>{ans}</answer>" if h % 5 else ans)
        return SimpleNamespace(texts=texts)


def test_report_numbers_recompute_from_its_raw_predictions(tmp_path, med):
    ops = [n for n, op in OPERATORS.items()                            # this data has no audio
           if op.kind != "audio" and n not in VIDEO_OPS]                 # and no video
    scripted = _Scripted()
    records = run_stress(scripted, scripted, med[:22] + HAND, ops, format_prompt=FMT, batch_size=7,
                         progress=False)
    report = {"settings": {"model": "scripted", "data": "med"}, "predictions": records,
              "summary": summarize(records, ops, n_boot=200, seed=0)}
    write_report(tmp_path, report)
    saved = json.loads((tmp_path / "report.json").read_text())
    preds, figs = saved["predictions"], saved["summary"]
    assert (tmp_path / "stress.png").stat().st_size > 5000
    md = (tmp_path / "report.md").read_text()
    assert all(f"| {name} |" in md for name in ops) and "Task-altering" in md
    for r in preds:
        pred = extract_answer(r["completion"])
        assert r["extracted"] == pred
        assert r["correct"] == bool(pred is not None and match(pred, r["gold"], r["choices"]))
    clean = {r["row"]: r for r in preds if r["op"] == "clean"}
    assert len(clean) == 25 and figs["clean"]["all"]["n"] == 25
    nontrivial = 0
    for name in ops:
        mine = [r for r in preds if r["op"] == name]
        assert figs["ops"][name]["applied"] == len(mine)
        for subset in ("all", "closed", "open"):
            pick = [r for r in mine if subset == "all" or clean[r["row"]]["answer_type"] == subset]
            m = figs["ops"][name][subset]
            assert m["n"] == len(pick)
            if not pick:
                continue
            base = [clean[r["row"]]["correct"] for r in pick]
            now = [r["correct"] for r in pick]
            b = sum(x and not y for x, y in zip(base, now))
            c = sum(y and not x for x, y in zip(base, now))
            assert m["accuracy"] == pytest.approx(sum(now) / len(now))
            assert m["drop"] == pytest.approx(100 * (sum(base) - sum(now)) / len(now))
            assert m["flip_rate"] == pytest.approx((b + c) / len(now))
            assert m["mcnemar_p"] == pytest.approx(_binomial_p(b, c))
            assert m["drop_ci95"] == paired_metrics(base, now, 200, 0)["drop_ci95"]
            nontrivial += b + c > 0
    assert nontrivial > 10
    texts = [e["all"]["drop"] for e in figs["ops"].values() if e["kind"] == "text"]
    assert figs["groups"]["text"]["all"] == pytest.approx(sum(texts) / len(texts))
    assert "mc_to_open" not in [n for n, e in figs["ops"].items() if e["kind"] == "text"]


def test_stress_cli_on_a_tiny_model_writes_the_report(tmp_path, tiny_vl, med):
    from mmrlvr.cli import main

    data = Path(med[0].images[0]).parent.parent / "test.jsonl"
    out = tmp_path / "report"
    assert main(["stress", "--model", str(tiny_vl), "--data", str(data), "--out", str(out),
                 "--ops", "template_swap", "option_shuffle", "blur", "mc_to_open",
                 "--limit", "5", "--max-new-tokens", "4", "--bootstrap", "50",
                 "--format-prompt", FMT]) == 0
    saved = json.loads((out / "report.json").read_text())
    assert saved["settings"]["ops"] == ["template_swap", "option_shuffle", "blur", "mc_to_open"]
    assert sum(r["op"] == "clean" for r in saved["predictions"]) == 5
    assert {r["op"] for r in saved["predictions"]} >= {"clean", "template_swap", "blur"}
    assert (out / "report.md").is_file() and (out / "stress.png").is_file()
    assert main(["stress", "--model", str(tiny_vl), "--data", str(data), "--out", str(out),
                 "--ops", "no_such_op"]) == 2


def test_a_run_dir_brings_its_prompts_and_a_hub_id_nothing(tmp_path, monkeypatch):
    from mmrlvr.stress.run import find_run_config

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    (run / "config.yaml").write_text("data: {format_prompt: Be brief., templates: ['Q: {question}']}\n")
    model, cfg = find_run_config(run)
    assert model == run / "final" and cfg["data"]["format_prompt"] == "Be brief."
    assert find_run_config(run / "checkpoints" / "step-2") == (run / "checkpoints" / "step-2", cfg)
    monkeypatch.chdir(run)                                   # a stray config.yaml in the cwd
    assert find_run_config("Qwen/Qwen2.5-VL-7B-Instruct")[1] == {}


# --- video operators --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from mmrlvr.tasks.motion import make_motion

    out = tmp_path_factory.mktemp("motion-stress")
    make_motion(out, n_train=0, n_test=6, seed=1)              # two rows of each family
    return load_jsonl(out / "test.jsonl")


def _edges(frames) -> list[bytes]:
    return [f.tobytes() for f in frames]


def test_frame_drop_keeps_the_gold_order_and_ends_and_skips_counting_rows(clips):
    from mmrlvr.data import read_video

    op = OPERATORS["frame_drop"]
    for ex in clips:
        variant = apply(op, ex, FMT, seed=0)
        if ex.meta["needs_every_frame"]:                       # blink, appear: a frame may matter
            assert variant is None, ex.id
            continue
        new = variant.example
        assert new.answer == ex.answer and gold_preserved(ex, new) and new.prompt == ex.prompt
        full = read_video(ex.videos[0], fps=4.0).frames
        kept = new.videos[0]
        assert len(kept) == 6 and kept[0].tobytes() == full[0].tobytes()
        assert kept[-1].tobytes() == full[-1].tobytes()
        where = [_edges(full).index(f.tobytes()) for f in kept]
        assert where == sorted(where)                          # order kept
        again = apply(op, ex, FMT, seed=0).example.videos[0]
        assert _edges(again) == _edges(kept)                   # seeded
        assert len(read_video(kept).frames) == 6               # the adapter can read it back
    assert apply(op, HAND[2], FMT) is None                     # no video


def test_frame_order_reverses_and_remaps_the_gold_or_skips(clips):
    from mmrlvr.data import read_video
    from mmrlvr.tasks.motion import OPPOSITE

    op = OPERATORS["frame_order"]
    assert op.kind == "video" and op.changes_gold              # it changes what the clip shows
    seen = Counter()
    for ex in clips:
        variant = apply(op, ex, FMT, seed=0)
        family = ex.meta["family"]
        if family == "appear":                                 # nothing appears backwards
            assert variant is None
            continue
        seen[family] += 1
        new = variant.example
        full = read_video(ex.videos[0], fps=4.0).frames
        assert _edges(new.videos[0]) == _edges(full[::-1])
        assert new.answer == (OPPOSITE[ex.answer] if family == "direction" else ex.answer)
    assert seen == {"direction": 2, "blink": 2}


def test_dynamic_draws_are_seeded_keep_the_gold_and_vary_the_wording(med):
    from mmrlvr.stress.dynamic import draw

    for ex in med + HAND:
        drawn = [draw(ex, FMT, 0, k) for k in range(6)]
        assert [(v.example.prompt, v.format_prompt) for v in drawn] == \
            [(draw(ex, FMT, 0, k).example.prompt, draw(ex, FMT, 0, k).format_prompt)
             for k in range(6)]                                          # seeded per (seed, k, id)
        for v in drawn:
            assert gold_preserved(ex, v.example)
            assert any(t.split("{question}")[0] in v.example.prompt for t in HELDOUT_TEMPLATES)
        assert len({(v.example.prompt, v.format_prompt) for v in drawn}) >= 3, ex.id
    assert draw(med[0], FMT, 0, 0).example.prompt != draw(med[0], FMT, 1, 0).example.prompt or \
        draw(med[0], FMT, 0, 1).example.prompt != draw(med[0], FMT, 1, 1).example.prompt


def test_dynamic_figures_are_mean_and_worst_case_per_question_and_overall(tmp_path, med):
    from mmrlvr.stress.dynamic import run_dynamic, summarize_dynamic

    scripted = _Scripted()
    examples = med[:12] + HAND
    clean = {r["row"]: r for r in run_stress(scripted, scripted, examples, [], format_prompt=FMT,
                                             progress=False)}
    drawn = run_dynamic(scripted, scripted, examples, 4, format_prompt=FMT, batch_size=5,
                        progress=False)
    assert len(drawn) == 4 * len(examples) and {r["draw"] for r in drawn} == {0, 1, 2, 3}
    dyn = summarize_dynamic(drawn, clean, n_boot=200, seed=0)
    assert dyn["k"] == 4
    by_row = {}
    for r in drawn:
        by_row.setdefault(r["row"], []).append(r["correct"])
    for q in dyn["questions"]:                                   # by hand, per question
        right = by_row[q["row"]]
        assert q["mean"] == pytest.approx(sum(right) / 4) and q["worst"] == float(all(right))
        assert q["clean"] == clean[q["row"]]["correct"]
    qs = dyn["questions"]
    f = dyn["overall"]["all"]
    assert f["n"] == len(examples)
    assert f["mean_accuracy"] == pytest.approx(sum(q["mean"] for q in qs) / len(qs))
    assert f["worst_accuracy"] == pytest.approx(sum(q["worst"] for q in qs) / len(qs))
    assert f["worst_accuracy"] <= f["mean_accuracy"]
    assert f["mean_drop"] == pytest.approx(100 * (f["clean_accuracy"] - f["mean_accuracy"]))
    assert f["worst_drop"] == pytest.approx(100 * (f["clean_accuracy"] - f["worst_accuracy"]))
    assert 0 < sum(q["worst"] < q["mean"] for q in qs)           # the scripted model is not constant
    closed = dyn["overall"]["closed"]
    assert closed["n"] == sum(q["answer_type"] == "closed" for q in qs)


def test_stress_cli_dynamic_on_a_tiny_model(tmp_path, tiny_vl, med):
    from mmrlvr.cli import main

    data = Path(med[0].images[0]).parent.parent / "test.jsonl"
    out = tmp_path / "dyn"
    assert main(["stress", "--model", str(tiny_vl), "--data", str(data), "--out", str(out),
                 "--ops", "template_swap", "--dynamic", "3", "--limit", "4",
                 "--max-new-tokens", "4", "--bootstrap", "50", "--format-prompt", FMT]) == 0
    saved = json.loads((out / "report.json").read_text())
    assert saved["settings"]["dynamic"] == 3
    assert len(saved["dynamic_predictions"]) == 12
    assert saved["dynamic"]["overall"]["all"]["n"] == 4
    assert "Dynamic evaluation (3 fresh draws per question)" in (out / "report.md").read_text()
