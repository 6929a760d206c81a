"""`mmrlvr check-method pirl`: greedy answers under the plain question vs each template of the
pool, on the tiny real model (counted again by hand from the same completions), through the CLI
end to end, and the verdict on both sides of its floor with a scripted engine."""
from __future__ import annotations

import json
from types import SimpleNamespace

from mmrlvr.core.method_check import VERDICTS, CheckContext, CheckOptions
from mmrlvr.core.registry import METHOD_CHECKS
from mmrlvr.data import Example, load_jsonl


def recorded(monkeypatch) -> list[tuple[list[str], list[str]]]:
    """(prompts, texts) of every real HF generate call, in order (the engine still runs)."""
    from mmrlvr.rollout.hf import HFRolloutEngine

    calls, real = [], HFRolloutEngine.generate

    def spy(self, batch, params):
        out = real(self, batch, params)
        calls.append(([ex.prompt for ex in batch.examples], list(out.texts)))
        return out
    monkeypatch.setattr(HFRolloutEngine, "generate", spy)
    return calls


def test_pirl_check_counts_changed_answers_as_by_hand(policy, shapes_dir, monkeypatch):
    from mmrlvr.core.templates import TRAIN_TEMPLATES, render
    from mmrlvr.methods.pirl.check import CHANGED_FLOOR, verdict
    from rewards.verify import extract_answer

    rows = load_jsonl(shapes_dir / "train.jsonl")[:3]
    calls = recorded(monkeypatch)
    opts = CheckOptions(rows=3, max_new_tokens=8)
    result = METHOD_CHECKS.get("pirl")(CheckContext(rows, opts, lambda: policy))
    swapped = [t for t in TRAIN_TEMPLATES if t != "{question}"]
    assert result.figures["templates"] == len(swapped) == 4 and result.figures["rows"] == 3
    assert len(calls) == 1 + len(swapped)                    # plain, then one call per template
    assert calls[0][0] == [ex.prompt for ex in rows]
    for k, t in enumerate(swapped):
        assert calls[1 + k][0] == [render(t, ex.prompt) for ex in rows]
    norm = lambda a: None if a is None else " ".join(a.split()).lower()  # noqa: E731
    base = [norm(extract_answer(x)) for x in calls[0][1]]
    rates = [sum(norm(extract_answer(x)) != b for x, b in zip(texts, base)) / 3
             for _, texts in calls[1:]]
    for k, rate in enumerate(rates):
        assert abs(result.figures[f"template{k}/answer_changed_frac"] - rate) < 1e-4
    assert abs(result.figures["worst_template_changed_frac"] - max(rates)) < 1e-4
    assert (result.verdict, result.why) == verdict(result.figures)
    assert result.floors == {"worst_template_changed_frac": CHANGED_FLOOR}


def test_cli_runs_the_pirl_check_on_the_tiny_model_with_the_configs_pool(tiny_vl, shapes_dir, tmp_path):
    from mmrlvr.cli import main

    out = tmp_path / "pirl.json"
    assert main(["check-method", "pirl", "--model", str(tiny_vl), "--data",
                 str(shapes_dir / "train.jsonl"), "--rows", "2", "--max-new-tokens", "8",
                 "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["verdict"] in VERDICTS and got["figures"]["templates"] == 4
    assert got["figures"]["rows"] == 2 and 0 <= got["figures"]["question_changed_frac"] <= 1
    config = tmp_path / "run.yaml"                            # the run's own pool is the one checked
    config.write_text(f"model: {{path: {tiny_vl}}}\ndata: {{train: {shapes_dir / 'train.jsonl'},\n"
                      "  templates: ['{question}', 'Q: {question}']}\nrollout: {max_new_tokens: 8}\n")
    assert main(["check-method", "pirl", "--config", str(config), "--rows", "2",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["figures"]["templates"] == 1


def scripted(answer_of):
    """An engine whose greedy answer for a prompt is `answer_of(prompt)`."""
    def generate(batch, params):
        return SimpleNamespace(texts=[f"<answer>{answer_of(ex.prompt)}</answer>" for ex in batch.examples])
    return SimpleNamespace(generate=generate)


def run_scripted(monkeypatch, answer_of, n: int = 20):
    import mmrlvr.rollout as rollout
    from mmrlvr.methods.pirl.check import check

    monkeypatch.setattr(rollout, "make_engine", lambda *a, **k: scripted(answer_of))
    fake = SimpleNamespace()
    monkeypatch.setattr(CheckOptions, "prompting", property(
        lambda self: SimpleNamespace(encode=lambda policy, rows: SimpleNamespace(examples=rows))))
    rows = [Example(id=f"q{i}", prompt=f"item {i}", answer="2") for i in range(n)]
    return check(CheckContext(rows, CheckOptions(), lambda: fake))


def test_pirl_verdict_is_inactive_for_an_invariant_model_and_active_past_the_floor(monkeypatch):
    invariant = run_scripted(monkeypatch, lambda p: 2)
    assert invariant.verdict == "inactive" and "already invariant" in invariant.why
    assert invariant.figures["plain_acc"] == 1.0 and invariant.figures["acc_drop"] == 0.0
    # "Question: ..." answers wrong on items 0 and 1: 2 of 20 = 10 % > 5 %
    swap = lambda p: 3 if p in ("Question: item 0", "Question: item 1") else 2  # noqa: E731
    active = run_scripted(monkeypatch, swap)
    assert active.verdict == "active", active.why
    assert active.figures["template0/answer_changed_frac"] == 0.1
    assert active.figures["worst_template_changed_frac"] == 0.1
    assert active.figures["question_changed_frac"] == 0.1
    assert abs(active.figures["acc_drop"] - 0.1 / 4) < 1e-4 and active.figures["worst_acc_drop"] == 0.1
    # at the floor (1 of 20 = 5 %) it is not above it
    edge = run_scripted(monkeypatch, lambda p: 3 if p == "Question: item 0" else 2)
    assert edge.figures["worst_template_changed_frac"] == 0.05 and edge.verdict == "inactive"


def test_pirl_verdict_needs_a_parsed_answer_and_a_template():
    from mmrlvr.methods.pirl.check import same_answer, swap_figures, verdict

    rows = [Example(id="a", prompt="q", answer="2")]
    none = swap_figures(rows, ["no answer"], [["still none"]])
    assert none["parsed_frac"] == 0 and "no greedy answer parses" in verdict(none)[1]
    assert "nothing to swap" in verdict(swap_figures(rows, ["<answer>2</answer>"], []))[1]
    assert same_answer(" Circle ", "circle") and not same_answer("2", None) and same_answer(None, None)
