"""The demo's Robustness and Training monitor tabs as plain functions (tiny Qwen2.5-VL, real run
dirs as the trainer writes them)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from apps import monitor_tab, robustness_tab
from apps.common import DemoContext
from mmrlvr.core.templates import HELDOUT_TEMPLATES, TRAIN_TEMPLATES
from mmrlvr.data import Example
from mmrlvr.stress import OPERATORS, Variant, apply
from tests.apps_helpers import write_model_run, write_run

pytestmark = pytest.mark.filterwarnings("ignore:::gradio.queueing")


@pytest.fixture(scope="module")
def ctx(policy, tiny_vl):
    return DemoContext(policy=policy, model_path=str(tiny_vl))


@pytest.fixture(scope="module")
def image(shapes_dir) -> str:
    return str(min((shapes_dir / "images").glob("*.png")))


# ---------------------------------------------------------------- Robustness

def test_robustness_rows_fill_in_per_operator_and_the_rest_are_named(ctx, image):
    updates = list(robustness_tab.run(ctx, image, "How many shapes are in the image?", gold="2",
                                      max_new_tokens=8))
    rows, gallery, status = updates[-1]
    names = [r[0] for r in rows]
    image_ops = [n for n, op in OPERATORS.items() if op.kind == "image"]
    # an image, no options: every image op and the option-free text ops; no audio op offered
    expected = [n for n, op in OPERATORS.items() if op.kind == "image" or n in
                ("template_swap", "format_instruction", "irrelevant_context")]
    assert names == ["clean", *[n for n in OPERATORS if n in expected]]
    progress = [u for u in updates[:-1] if u[2].endswith("…")]          # each operator's start
    assert [len(u[0]) for u in progress] == list(range(len(rows)))       # one more row each time
    assert [u[2] for u in progress][:2] == ["Running **clean** (1 of 10)…",
                                            f"Running **{names[1]}** (2 of 10)…"]
    counts = [int(u[2].removesuffix(" tokens").rsplit(" ", 1)[1]) for u in updates
              if u[2].startswith("Running **clean** (1 of 10)… ")]
    assert counts[:-1] == list(range(1, len(counts))) and counts[-1] == counts[-2] <= 8  # per token
    assert status.startswith(f"✓ {len(expected)} operators ran")
    assert ("Did not apply to this sample: paraphrase (no reviewed rewrite rule matches the "
            "question); option_shuffle (needs options and a gold answer); option_relabel "
            "(needs options); mc_to_open (needs options and a gold answer).") in status
    audio_ops = [n for n, op in OPERATORS.items() if op.kind == "audio"]
    assert audio_ops and not any(n in status for n in audio_ops)
    assert {r[4] for r in rows} <= {"✓", "✗"} and {r[1] for r in rows[1:]} == {"text", "image"}
    assert len(rows[0]) == len(robustness_tab.TABLE_HEADERS)
    assert "[format instruction:" in rows[names.index("format_instruction")][2]
    assert [c for _, c in gallery] == ["clean", *image_ops]
    assert all(img.size == gallery[0][0].size for img, _ in gallery)
    assert not np.array_equal(np.asarray(gallery[0][0]), np.asarray(gallery[1][0]))
    flips = int(status.split(", ")[1].split()[0])
    assert flips == sum(r[5] == "⚠ flip" for r in rows)
    assert "Type a question" in list(robustness_tab.run(ctx, image, ""))[-1][2]
    assert "Upload an image" in list(robustness_tab.run(ctx, None, "How many?"))[-1][2]


def test_template_and_context_operators_fit_the_questions_domain():
    img = Image.new("RGB", (56, 56), (120, 120, 120))
    shapes = robustness_tab.make_example([img], "How many shapes are there?")
    cases, _ = robustness_tab.variants(shapes, "Put the answer in <answer></answer>.")
    prompts = {name: v.example.prompt for name, _, v in cases}
    templates, sentences = robustness_tab.DOMAIN_TEXT["image"]
    assert any(prompts["template_swap"] == t.replace("{question}", "How many shapes are there?")
               for t in templates)
    assert "Clinical" not in prompts["template_swap"] and "scan" not in prompts["template_swap"]
    assert any(prompts["irrelevant_context"].startswith(s) for s in sentences)
    assert not set(templates) & set(TRAIN_TEMPLATES)                   # still held out
    assert templates[0] in HELDOUT_TEMPLATES                           # the library's neutral one
    scan = robustness_tab.make_example([img], "Is there a nodule in the left lung?")
    cases, _ = robustness_tab.variants(scan, "", domain="medical")
    swapped = {name: v.example.prompt for name, _, v in cases}["template_swap"]
    assert swapped == apply(OPERATORS["template_swap"], scan, "").example.prompt  # the library's
    assert {n for n, _, _ in cases} >= {"paraphrase"}
    audio_ops = robustness_tab.operators("audio")
    assert {op.kind for op in audio_ops.values()} == {"text", "audio", "task"}
    clip = Example(id="a", prompt="q", answer="x", audios=["a.wav"])
    swapped = apply(audio_ops["template_swap"], clip, "").example.prompt
    assert swapped in [t.replace("{question}", "q") for t in robustness_tab.DOMAIN_TEXT["audio"][0]]


def test_robustness_with_options_runs_the_option_and_task_altering_operators(ctx, image):
    rows, gallery, status = list(robustness_tab.run(
        ctx, image, "Which shape is shown?", gold="B", max_new_tokens=8,
        choices="A. circle\nB. square\nC. triangle"))[-1]
    names = [r[0] for r in rows]
    assert names == ["clean", *[n for n, op in OPERATORS.items()
                                if op.kind not in ("audio", "video") and n != "paraphrase"]]
    assert rows[0][2] == "Which shape is shown?\nA. circle\nB. square\nC. triangle"
    kinds = dict(zip(names, (r[1] for r in rows)))
    assert kinds["mc_to_open"] == "task-altering" and kinds["option_shuffle"] == "text"
    assert rows[names.index("mc_to_open")][2] == "Which shape is shown?"
    assert "1 task-altering" in status and len(gallery) == 7
    for bad, why in [("only one", "at least two options"), ("A. x\nB. y", "gold answer")]:
        assert why in list(robustness_tab.run(ctx, image, "Which?", gold="Q", choices=bad))[-1][2]


def test_robustness_table_marks_flips_against_the_clean_answer():
    ex = Example(id="t", prompt="q", answer="3")
    cases = [("clean", "-", Variant(ex, "")), ("blur", "image", Variant(ex, "")),
             ("crop", "image", Variant(ex, "")), ("format_instruction", "text", Variant(ex, "F"))]
    texts = ["<answer>3</answer>", "<answer>3.0</answer>", "<answer>4</answer>", "no idea"]
    rows, flips = robustness_tab.table(cases, texts, gold="3")
    assert flips == 2
    assert [r[5] for r in rows] == ["", "", "⚠ flip", "⚠ flip"]
    assert [r[4] for r in rows] == ["✓", "✓", "✗", "✗"]
    assert rows[3][3] == "(none)" and rows[3][2] == "q\n[format instruction: F]"
    rows, flips = robustness_tab.table(cases, ["<answer>4</answer>"] * 4, gold="3")
    assert flips == 0 and [r[4] for r in rows] == ["✗"] * 4
    # with options, the chosen option counts, not its letter
    mc = Example(id="m", prompt=robustness_tab.with_options("Which?", ["cat", "dog", "cow"]),
                 answer="A", choices=["cat", "dog", "cow"])
    shuffled = apply(OPERATORS["option_shuffle"], mc, "")
    new_letter = chr(65 + shuffled.example.choices.index("cat"))
    cases = [("clean", "-", Variant(mc, "")), ("option_shuffle", "text", shuffled),
             ("option_shuffle", "text", shuffled)]
    rows, flips = robustness_tab.table(
        cases, ["<answer>A</answer>", f"<answer>{new_letter}</answer>", "<answer>A</answer>"],
        gold="A")
    assert flips == 1 and [r[5] for r in rows] == ["", "", "⚠ flip"]
    assert robustness_tab.parse_choices("A. cat\n\n(B) dog\nE. coli") == ["cat", "dog", "E. coli"]
    assert robustness_tab.parse_choices("  \n") is None


# ---------------------------------------------------------------- Training monitor

def test_monitor_draws_labelled_panels_with_eval_markers_while_the_run_writes(tmp_path):
    run = write_run(tmp_path / "run")
    fig, start_end, status = monitor_tab.refresh(str(run), 0.0, root=str(tmp_path))
    assert "(GRPO run): training, step 6 / 12" in status and "reward/mean 0.6" in status
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [p[0] for p in monitor_tab.PANELS["grpo"]]
    assert all(ax.get_xlabel().startswith("GRPO step") for ax in axes)
    assert [ax.get_ylabel() for ax in axes][2:] == ["mean length (tokens)", "KL (nats per token)"]
    eval_line = next(line for line in axes[1].lines if line.get_marker() == "o")
    assert list(eval_line.get_ydata()) == [0.2]
    assert start_end.startswith("Held-out accuracy **0.200 → 0.200**")
    assert "so far" in start_end
    (run / "summary.json").write_text(json.dumps({"accuracy_start": 0.2, "accuracy_end": 0.5}))
    _, start_end, status = monitor_tab.refresh(str(run), root=str(run))
    assert "finished" in status
    assert start_end == "Held-out accuracy **0.200 → 0.500** (+30.0 points) (summary.json)."


def test_monitor_smoothing_keeps_the_raw_curve_faint():
    assert monitor_tab.smooth([1.0, 0.0, 0.0], 0.0) == [1.0, 0.0, 0.0]
    assert monitor_tab.smooth([2.0, 2.0], 0.9) == pytest.approx([2.0, 2.0])   # debiased
    smoothed = monitor_tab.smooth([0.0, 1.0] * 20, 0.8)
    assert max(smoothed[10:]) - min(smoothed[10:]) < 0.4
    rows = [{"step": s, "reward/mean": float(s % 2)} for s in range(1, 21)]
    fig = monitor_tab.figure(rows, "grpo", smoothing=0.8)
    raw, smooth = fig.axes[0].lines
    assert raw.get_alpha() < 0.5 and len(smooth.get_ydata()) == 20
    assert "smoothed 0.8" in smooth.get_label()


def test_monitor_shows_an_sft_run_with_its_loss_and_step_total(tmp_path, tiny_vl, shapes_dir):
    run = write_model_run(tmp_path / "sft", tiny_vl, tiny_vl, shapes_dir / "test.jsonl",
                          kind="sft")
    fig, start_end, status = monitor_tab.refresh(str(run), 0.5, root=str(run))
    assert "(SFT run): finished, step 6 / 18" in status and "sft/loss" in status
    assert fig.axes[0].get_title() == "SFT loss" and len(fig.axes[0].lines) == 2
    assert fig.axes[0].get_ylabel() == "cross-entropy (nats per token)"
    assert fig.axes[0].get_xlabel().startswith("SFT step")
    assert "0.250 → 0.550" in start_end


def test_monitor_says_what_is_missing_and_redraws_only_on_change(tmp_path):
    run = write_run(tmp_path / "nokl", kl=False, partial=False)
    fig, _, status = monitor_tab.refresh(str(run), root=str(tmp_path))
    assert "Not logged: KL to the reference" in status and "algo.beta" in status
    assert fig.axes[3].texts[0].get_text() == "not logged"
    root = str(tmp_path)
    assert "does not exist" in monitor_tab.refresh(str(tmp_path / "nope"), root=root)[-1]
    (tmp_path / "fresh").mkdir()
    assert "Waiting for the first step" in monitor_tab.refresh(str(tmp_path / "fresh"),
                                                               root=root)[-1]
    assert "Give a run dir" in monitor_tab.refresh("", root=str(tmp_path))[-1]
    before = monitor_tab.signature(str(run), 0.6, str(tmp_path))
    assert monitor_tab.signature(str(run), 0.6, str(tmp_path)) == before
    assert monitor_tab.signature(str(run), 0.7, str(tmp_path)) != before
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"step": 7, "reward/mean": 0.9}) + "\n")
    assert monitor_tab.signature(str(run), 0.6, str(tmp_path)) != before
