"""Rollout recycling: instances from scored groups, their tensors, the loss on the tiny
Qwen2.5-VL, and the run-dir file that traces every instance back to its rollouts."""
from __future__ import annotations

import math

import json

import pytest
import torch

from mmrlvr import objectives
from mmrlvr.data import load_jsonl
from mmrlvr.core.types import Scores
from mmrlvr.objectives import StepContext
from mmrlvr.methods.structreward.recycling import Recycling, build_instances, collate
from mmrlvr.rollout import SamplingParams, make_engine
from mmrlvr.core.types import select

BRIDGE = "Wait, let me check again."


def _scores(flags):
    return Scores([[{"overall": float(f), "accuracy": float(f)} for f in group] for group in flags])


# ----------------------------------------------------------------------------- instances

def test_mixed_groups_give_pairs_and_self_corrections_round_robin():
    texts = ["w0", "c0", "w1", "c1",        # group 0: two correct, two wrong
             "a", "b", "c", "d",            # group 1: all correct, nothing to compare
             "x", "x", "ok", "y",           # group 2: the wrong "x" twice, kept once
             "w0", "c0", "w1", "c1"]        # group 3: group 0 again (same example id)
    flags = [[0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 1, 0], [0, 1, 0, 1]]
    ids = ["e0", "e1", "e2", "e0"]
    got, stats = build_instances(texts, _scores(flags), 4, ids, bridge=BRIDGE)
    assert [(i.kind, i.group, i.rows) for i in got] == [
        ("pair", 0, {"chosen": 1, "rejected": 0}),
        ("pair", 2, {"chosen": 10, "rejected": 8}),
        ("self_correction", 0, {"wrong": 0, "correct": 1}),
        ("self_correction", 2, {"wrong": 8, "correct": 10}),
        ("pair", 0, {"chosen": 3, "rejected": 2}),
        ("self_correction", 0, {"wrong": 2, "correct": 3}),
    ]
    assert got[2].context == f"w0\n{BRIDGE}\n" and got[0].context == ""
    assert [i.example_id for i in got] == ["e0", "e2", "e0", "e2", "e0", "e0"]
    assert all(i.target_row == (i.rows.get("chosen", i.rows.get("correct"))) for i in got)
    assert stats == {"instances": 6.0, "pairs": 3.0, "self_corrections": 3.0,
                     "mixed_groups": 0.75, "duplicates": 4.0, "capped": 0.0}

    capped, stats = build_instances(texts, _scores(flags), 4, ids, max_per_step=3,
                                    self_correction=False)
    assert [i.rows["chosen"] for i in capped] == [1, 10, 3]
    assert (stats["pairs"], stats["self_corrections"], stats["capped"]) == (3.0, 0.0, 0.0)
    capped, stats = build_instances(texts, _scores(flags), 4, ids, max_per_step=2)
    assert [i.kind for i in capped] == ["pair", "pair"] and stats["capped"] == 4.0


def test_correct_is_the_named_component_else_the_overall_reward():
    def correct(score, key, threshold, **kw):
        return bool(Scores([[score]]).correct(key, threshold, **kw)[0, 0])
    assert correct({"overall": 0.1, "accuracy": 1.0}, "accuracy", 0.5)
    assert not correct({"overall": 0.9, "accuracy": 0.0}, "accuracy", 0.5)
    assert correct({"overall": 1.2}, "accuracy", 1.0)            # no accuracy component
    assert not correct({"overall": 0.45, "struct_steps": 0.45}, "struct_steps", 1.0)
    with pytest.raises(KeyError, match="'accuracy' is not among the step's reward parts"):
        correct({"overall": 1.2}, "accuracy", 1.0, strict=True)
    scores = Scores([[{"overall": float("nan"), "a": 1.0}, {"overall": 2.0, "a": 0.0}]])
    assert scores.nonfinite.tolist() == [[True, False]] and scores.total.tolist() == [[0.0, 2.0]]
    assert scores.keys == ["a"] and scores.values("a") == [1.0, 0.0] and len(scores) == 1
    assert Scores([]).total.shape == (0, 0) and Scores([]).keys == []


def test_collate_attends_to_the_context_but_supervises_the_target_only():
    ids, attention, loss_mask = collate([[7, 8], []], [[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[7, 8, 1, 2, 3], [4, 0, 0, 0, 0]]
    assert attention.tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert loss_mask.tolist() == [[0, 0, 1, 1, 1], [1, 0, 0, 0, 0]]


@pytest.mark.parametrize("options, message", [({"max_per_step": 0}, "max_per_step"),
                                              ({"pairs": False, "self_correction": False}, "off")])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        Recycling(**options)


def test_registered_and_built_from_config():
    [(weight, obj)] = objectives.build([{"name": "recycling", "weight": 0.2, "max_per_step": 2}])
    assert weight == 0.2 and isinstance(obj, Recycling) and obj.options["max_per_step"] == 2


# ----------------------------------------------------------------------------- on a real policy

FLAGS = [[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 0]]


@pytest.fixture(scope="module")
def rollouts(policy, shapes_dir):
    examples = load_jsonl(shapes_dir / "train.jsonl")[:3]
    prompts = policy.adapter.encode(examples, policy.processor)
    torch.manual_seed(0)
    out = make_engine("hf", policy).generate(prompts, SamplingParams(n=4, max_new_tokens=8))
    assert len(set(out.texts)) == len(out.texts)   # distinct texts: instance counts are exact
    return out


def _ctx(policy, rollouts, step=3, run_dir=None, flags=FLAGS):
    return StepContext(policy, rollouts, _scores(flags), torch.zeros(len(rollouts.texts)), step,
                       5, run_dir)


def _nll(policy, rollouts, row):
    """Summed NLL and token count of one rollout, alone (no batching, no padding)."""
    n = int(rollouts.completion_mask[row].sum())
    inputs, _ = select(rollouts.prompts, [row // rollouts.group_size])
    logp, _ = policy.completion_logprobs(inputs, rollouts.completion_ids[row:row + 1, :n],
                                         rollouts.completion_mask[row:row + 1, :n])
    return -logp.sum().item(), n


def test_recycled_instances_are_well_formed_and_traceable(policy, rollouts, tmp_path):
    obj = Recycling()
    loss, stats = obj.loss(_ctx(policy, rollouts, run_dir=tmp_path))
    assert loss.requires_grad and torch.isfinite(loss)
    assert stats["instances"] == 6 and stats["pairs"] == stats["self_corrections"] == 3
    assert stats["mixed_groups"] == pytest.approx(2 / 3) and stats["tokens"] > 0
    lines = (tmp_path / "recycled.jsonl").read_text().splitlines()
    rows = [json.loads(ln) for ln in lines]
    assert len(rows) == 6 and len({r["key"] for r in rows}) == 6
    G, texts = rollouts.group_size, rollouts.texts
    for r in rows:
        ex = rollouts.prompts.examples[r["group"]]
        assert r["step"] == 3 and r["example_id"] == ex.id and r["prompt"] == ex.prompt
        assert all(r["group"] * G <= row < (r["group"] + 1) * G for row in r["rows"].values())
        assert r["target"] == texts[r["target_row"]] and FLAGS[r["group"]][r["target_row"] % G]
        if r["kind"] == "pair":
            assert r["rows"]["chosen"] == r["target_row"] and r["context"] == ""
            assert r["rejected"] == texts[r["rows"]["rejected"]]
            assert not FLAGS[r["group"]][r["rows"]["rejected"] % G]
        else:
            assert r["kind"] == "self_correction" and r["rows"]["correct"] == r["target_row"]
            assert r["context"] == f"{texts[r['rows']['wrong']]}\n{BRIDGE}\n"
            assert not FLAGS[r["group"]][r["rows"]["wrong"] % G]
    # a second PPO epoch of the same step trains the same instances and writes nothing new
    again, _ = obj.loss(_ctx(policy, rollouts, run_dir=tmp_path))
    assert again.item() == pytest.approx(loss.item(), abs=1e-6)
    assert (tmp_path / "recycled.jsonl").read_text().splitlines() == lines
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())
    policy.model.zero_grad(set_to_none=True)


def test_pair_loss_nll_is_the_token_mean_nll_of_the_correct_rollouts(policy, rollouts):
    loss, stats = Recycling(self_correction=False, pair_loss="nll").loss(_ctx(policy, rollouts))
    correct_rows = [0, 2, 9]              # group 0: rows 0 and 2 correct; group 2: row 9
    parts = [_nll(policy, rollouts, r) for r in correct_rows]
    assert stats["pairs"] == 3 and stats["tokens"] == sum(n for _, n in parts)
    assert loss.item() == pytest.approx(sum(s for s, _ in parts) / stats["tokens"], rel=1e-5)


def _seq_logprob(policy, rollouts, row):
    n = int(rollouts.completion_mask[row].sum())
    inputs, _ = select(rollouts.prompts, [row // rollouts.group_size])
    ids = rollouts.completion_ids[row:row + 1, :n]
    logp, _ = policy.completion_logprobs(inputs, ids, torch.ones_like(ids))
    return logp.sum()


def test_pairs_train_the_comparison_against_the_rollout_policy(policy, rollouts):
    """The preference loss by hand: at the step's first call π = π_old, so every margin is 0,
    the loss is log 2, and its gradient is that of −β/2 · mean(log π(y_w) − log π(y_l))."""
    beta = 0.1
    obj = Recycling(self_correction=False, beta=beta)
    pairs = [(0, 1), (2, 3), (9, 8)]      # (correct, wrong) as build_instances pairs them
    policy.model.zero_grad(set_to_none=True)
    loss, stats = obj.loss(_ctx(policy, rollouts))
    assert stats["pairs"] == 3 and loss.item() == pytest.approx(math.log(2), rel=1e-6)
    assert stats["pair_margin"] == 0.0
    loss.backward()
    got = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
    policy.model.zero_grad(set_to_none=True)
    hand = -(beta / 2) * sum(_seq_logprob(policy, rollouts, w) - _seq_logprob(policy, rollouts, l)
                             for w, l in pairs) / len(pairs)
    hand.backward()
    for name, p in policy.model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(got[name], p.grad, atol=1e-6, rtol=1e-4, msg=name)
    # a later epoch of the same step keeps π_old: after the weights move, the margin does too
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.grad is not None:
                p.sub_(1e-2 * p.grad.sign())
    try:
        later, st = obj.loss(_ctx(policy, rollouts))
        assert st["pair_margin"] > 0 and later.item() < math.log(2)
        assert st["pair_chosen_gains"] == 1.0
    finally:
        with torch.no_grad():
            for p in policy.model.parameters():
                if p.grad is not None:
                    p.add_(1e-2 * p.grad.sign())
        policy.model.zero_grad(set_to_none=True)


def test_self_correction_supervises_the_correct_continuation_after_the_wrong_one(policy, rollouts):
    obj = Recycling(pairs=False, max_per_step=1)
    loss, stats = obj.loss(_ctx(policy, rollouts))
    wrong, correct = 1, 0                 # group 0: rows 0 and 2 correct, 1 and 3 wrong
    context = policy.tokenizer(f"{rollouts.texts[wrong]}\n{BRIDGE}\n",
                               add_special_tokens=False)["input_ids"]
    n = int(rollouts.completion_mask[correct].sum())
    target = rollouts.completion_ids[correct, :n].tolist()
    ids = torch.tensor([context + target])
    inputs, _ = select(rollouts.prompts, [0])
    logp, _ = policy.completion_logprobs(inputs, ids, torch.ones_like(ids))
    assert stats["tokens"] == n
    assert loss.item() == pytest.approx(-float(logp[0, len(context):].mean()), rel=1e-5)
    alone, _ = _nll(policy, rollouts, correct)
    assert abs(loss.item() - alone / n) > 1e-3                    # the wrong attempt is attended


def test_no_group_with_both_outcomes_means_no_loss(policy, rollouts, tmp_path):
    for flags in ([[1] * 4] * 3, [[0] * 4] * 3):
        loss, stats = Recycling().loss(_ctx(policy, rollouts, run_dir=tmp_path, flags=flags))
        assert loss is None and stats["instances"] == 0 and stats["tokens"] == 0
    assert not (tmp_path / "recycled.jsonl").exists()


def test_a_resumed_run_drops_rows_of_the_steps_it_redoes(policy, rollouts, tmp_path):
    path = tmp_path / "recycled.jsonl"
    path.write_text("".join(json.dumps({"step": s, "kind": "pair"}) + "\n" for s in (1, 2, 3, 4)))
    Recycling().loss(_ctx(policy, rollouts, step=3, run_dir=tmp_path))
    steps = [json.loads(ln)["step"] for ln in path.read_text().splitlines()]
    assert steps == [1, 2] + [3] * 6


# ----------------------------------------------------------------------------- form: tasks

def test_mixed_groups_become_a_comparison_and_a_self_correction_task():
    from mmrlvr.data import Example
    from mmrlvr.methods.structreward.tasks import build_tasks, task_rewards

    examples = [Example(id=f"e{b}", prompt=f"Q{b}?", answer=str(b), images=[f"img{b}.png"])
                for b in range(3)]
    texts = ["wrong0", "right0", "w", "r",  "a", "b", "c", "d",  "right2", "x", "y", "z"]
    flags = [[0, 1, 0, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
    tasks = build_tasks(texts, _scores(flags), 4, examples, step=7)
    assert [(t.kind, t.group, t.rows) for t in tasks] == [
        ("compare", 0, (1, 0)), ("compare", 2, (8, 9)), ("fix", 0, (0,)), ("fix", 2, (9,))]
    for t in tasks:
        src = examples[t.group]
        assert t.example.prompt.startswith(src.prompt) and t.example.images == src.images
        if t.kind == "compare":
            right, wrong = texts[t.rows[0]], texts[t.rows[1]]
            a = t.example.prompt.split("Attempt A:\n")[1].split("\n\n")[0]
            assert t.example.choices == ["A", "B"] and right in t.example.prompt and wrong in t.example.prompt
            assert (a == right) == (t.example.answer == "A")          # the gold names the right one
        else:
            assert texts[t.rows[0]] in t.example.prompt and t.example.answer == src.answer
    again = build_tasks(texts, _scores(flags), 4, examples, step=7)
    assert [t.example.prompt for t in again] == [t.example.prompt for t in tasks]   # resumes alike
    assert len(build_tasks(texts, _scores(flags), 4, examples, 7, max_tasks=3)) == 3
    assert [t.kind for t in build_tasks(texts, _scores(flags), 4, examples, 7, fix=False)] == ["compare"] * 2
    gold = tasks[0].example.answer
    other = "B" if gold == "A" else "A"
    got = task_rewards(tasks[:1], [f"<answer>{gold}</answer>", f"<answer>{other}</answer>",
                                   "no answer", f"I pick <answer>{gold}</answer>"], 4)
    assert got.tolist() == [[1.0, 0.0, 0.0, 1.0]]


def test_tasks_form_trains_the_tasks_by_their_verified_advantages(policy, rollouts, tmp_path, monkeypatch):
    import mmrlvr.methods.structreward.tasks as tasks_module

    fixed = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]] * 4)      # spread, then none
    monkeypatch.setattr(tasks_module, "task_rewards", lambda tasks, texts, group: fixed[:len(tasks)])
    obj = Recycling(form="tasks", task_group=4, task_max_new_tokens=6)
    torch.manual_seed(0)
    loss, stats = obj.loss(_ctx(policy, rollouts, run_dir=tmp_path))
    assert stats["tasks"] == 4 and stats["task_zero_spread_frac"] == 0.5
    assert {"task_compare_accuracy", "task_fix_accuracy"} <= set(stats)
    # first epoch: ratio 1, so the loss is −Σ A·m / Σ m and its gradient that of −Σ A·log π·m / Σ m
    task_rollouts, advantages, old = obj.tasks.batch
    m = task_rollouts.completion_mask.float()
    adv = advantages.unsqueeze(1)
    assert loss.item() == pytest.approx((-(adv * m).sum() / m.sum()).item(), abs=1e-6)
    assert advantages[4:8].abs().sum() == 0 and advantages[:4].abs().sum() > 0
    params = [p for p in policy.trainable_parameters()]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    rows = list(range(len(m)))
    logp, _ = policy.rollout_logprobs(task_rollouts.prompts, [r // 4 for r in rows],
                                      task_rollouts.completion_ids, task_rollouts.completion_mask)
    want = torch.autograd.grad(-(adv * logp * m).sum() / m.sum(), params, allow_unused=True)
    pairs = [(g, w) for g, w in zip(grads, want) if w is not None]
    assert pairs and any(w.abs().sum() > 0 for _, w in pairs)
    assert all(torch.allclose(g, w, atol=1e-6, rtol=1e-4) for g, w in pairs)
    again, _ = obj.loss(_ctx(policy, rollouts, run_dir=tmp_path))    # a later epoch: same samples
    assert obj.tasks.batch[0] is task_rollouts and again.item() == pytest.approx(loss.item(), abs=1e-6)
    rows = [json.loads(ln) for ln in (tmp_path / "recycled.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in rows] == ["compare", "compare", "fix", "fix"]
    assert all(r["step"] == 3 and r["prompt"] for r in rows)
    with pytest.raises(ValueError, match="form must be"):
        Recycling(form="dpo")


# ----------------------------------------------------------------------------- reflection rewrite

def test_a_rewrite_is_kept_only_with_the_gold_answer_a_reflection_and_a_change():
    from mmrlvr.data import Example
    from mmrlvr.methods.structreward.reflection import verdict

    ex = Example(id="e", prompt="2 + 1?", answer="3")
    src = "<think>2 + 1 = 3</think><answer>3</answer>"
    good = "<think>2 + 1 = 4. Wait, that is wrong: 2 + 1 = 3.</think><answer>3</answer>"
    assert verdict(good, src, ex) == "kept"
    assert verdict(good.replace("<answer>3", "<answer>4"), src, ex) == "answer"
    assert verdict("<think>2 + 1 = 3, so 3</think><answer>3</answer>", src, ex) == "no_reflection"
    assert verdict(src.replace("</think>", " wait</think>") * 10, src, ex) == "too_long"
    assert verdict("<think>hm</think>", src, ex) == "answer"


def test_reflection_trains_kept_rewrites_every_k_steps(policy, rollouts, tmp_path, monkeypatch):
    from mmrlvr.methods.structreward.reflection import Reflection

    obj = Reflection(every=3, max_instances=4)
    G = rollouts.group_size
    sources = []

    def rewrite(pol, examples, texts):
        sources.extend(texts)
        return [f"<think>Wait, a mistake, fixed.</think><answer>{examples[0].answer}</answer>",
                "no answer here"][:len(texts)]
    monkeypatch.setattr(obj, "rewrite", rewrite)
    assert obj.loss(_ctx(policy, rollouts, step=4)) == (None, {})      # not a multiple of 3
    loss, stats = obj.loss(_ctx(policy, rollouts, step=3, run_dir=tmp_path))
    # groups 0 and 2 hold a correct rollout (FLAGS): their first correct rows are 0 and 9
    assert sources == [rollouts.texts[0], rollouts.texts[9]]
    assert (stats["rewritten"], stats["kept"], stats["malformed"]) == (2.0, 1.0, 1.0)
    target = f"<think>Wait, a mistake, fixed.</think><answer>{rollouts.prompts.examples[0].answer}</answer>"
    ids = policy.tokenizer(target, add_special_tokens=False)["input_ids"] + policy.eos_ids[:1]
    inputs, _ = select(rollouts.prompts, [0])
    logp, _ = policy.completion_logprobs(inputs, torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long))
    assert stats["tokens"] == len(ids)
    assert loss.item() == pytest.approx(-logp.sum().item() / len(ids), rel=1e-5)
    rows = [json.loads(ln) for ln in (tmp_path / "reflections.jsonl").read_text().splitlines()]
    assert [(r["row"], r["verdict"]) for r in rows] == [(0, "kept"), (9, "answer")]


@pytest.mark.parametrize("rewriter", ["policy", "dir"])
def test_a_real_rewriter_fails_closed_on_malformed_rewrites(policy, rollouts, tiny_vl, rewriter):
    from mmrlvr.methods.structreward.reflection import Reflection

    obj = Reflection(every=1, max_instances=2, max_new_tokens=6,
                     rewriter="policy" if rewriter == "policy" else str(tiny_vl))
    loss, stats = obj.loss(_ctx(policy, rollouts, step=2))
    assert stats["rewritten"] == 2 and stats["kept"] + stats["malformed"] == 2
    assert (loss is None) == (stats["kept"] == 0)     # random weights: nothing well formed
    if rewriter == "dir":
        assert obj._rewriter is not policy and not any(p.requires_grad for p in obj._rewriter.model.parameters())
    with pytest.raises(FileNotFoundError, match="neither 'policy' nor a model dir"):
        Reflection(rewriter="/nowhere").rewriter(policy)
