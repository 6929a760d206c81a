"""OM-GRPO: the consensus reward (rewards/consensus.py) and the answer-span mask
(mmrlvr/methods/om_grpo/shaper.py) against hand computations, and one GRPO step with both."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

import rewards
from mmrlvr.algo import grpo_loss
from mmrlvr.methods.om_grpo.shaper import answer_span, answer_token_mask
from mmrlvr.algo.shaping import ShapeContext, build, token_credit
from mmrlvr.data import Example
from rewards.consensus import ConsensusReward
from rewards.verify import extract_answer


def ans(a: str) -> str:
    return f"<think>count</think><answer>{a}</answer>"


def scored(answers, gold="3", choices=None, **options):
    reward = ConsensusReward(**options)
    texts = [ans(a) if a is not None else "I am not sure" for a in answers]
    return reward.score(Example(id="q", prompt="How many?", answer=gold, choices=choices), texts)


def column(out, key):
    return [s[key] for s in out]


def test_consensus_is_the_share_of_parsed_answers_plus_pairwise_contrast():
    out = scored(["3", "3.0", "4", None])           # 3 = 3.0 through rewards.verify.match
    # support 2, 2, 1, 0 of 3 parsed; contrast: wins over the rest (draw with the agreeing one)
    soft = [2 / 3, 2 / 3, 1 / 3, 0.0]
    contrast = [(0.5 + 1 + 1) / 3 - 0.5, (0.5 + 1 + 1) / 3 - 0.5, (0 + 0 + 1) / 3 - 0.5, 0 - 0.5]
    assert column(out, "soft") == pytest.approx(soft)
    assert column(out, "contrast") == pytest.approx(contrast)
    assert sum(column(out, "contrast")) == pytest.approx(0.0)
    assert column(out, "overall") == pytest.approx([5 / 6, 5 / 6, 1 / 4, -1 / 4])  # weight 0.5
    assert column(out, "parsed") == [1.0, 1.0, 1.0, 0.0]
    assert column(out, "agree_frac") == [0.5] * 4
    assert column(out, "majority_correct") == [1.0] * 4
    plain = scored(["3", "3.0", "4", None], contrast_weight=0)
    assert column(plain, "overall") == pytest.approx(soft)


def test_consensus_never_reads_the_gold_for_its_score():
    right, wrong, unlabelled = (scored(["3", "3", "4", None], gold=g) for g in ("3", "4", "?"))
    assert column(right, "overall") == column(wrong, "overall") == column(unlabelled, "overall")
    assert column(right, "majority_correct") == [1.0] * 4
    assert column(wrong, "majority_correct") == [0.0] * 4
    assert column(unlabelled, "has_gold") == [0.0] * 4
    assert column(unlabelled, "majority_correct") == [0.0] * 4
    assert column(scored(["3"], gold="unk", placeholders=["unk"]), "has_gold") == [0.0]


def test_consensus_ties_split_the_vote_and_leave_no_spread():
    out = scored(["circle", "square", "Circle", "square."], gold="circle")
    assert column(out, "soft") == pytest.approx([0.5] * 4)
    assert column(out, "contrast") == pytest.approx([0.0] * 4)
    assert column(out, "majority_correct") == pytest.approx([0.5] * 4)   # half the tied top is right
    nothing = scored([None, None, None])
    assert column(nothing, "overall") == [0.0] * 3
    assert column(nothing, "majority_correct") == [0.0] * 3 and column(nothing, "agree_frac") == [0.0] * 3


def test_consensus_with_choices_counts_a_letter_and_its_option_text_as_one_answer():
    choices = ["circle", "square", "triangle"]
    out = scored(["B", "square", "(B)", "A"], gold="B", choices=choices)
    assert column(out, "soft") == pytest.approx([3 / 4, 3 / 4, 3 / 4, 1 / 4])
    assert column(out, "contrast") == pytest.approx([1 / 6, 1 / 6, 1 / 6, -1 / 2])
    assert column(out, "majority_correct") == [1.0] * 4
    assert column(out, "agree_frac") == [0.75] * 4
    no_choices = scored(["B", "square", "(B)", "A"], gold="B")
    assert column(no_choices, "soft") == pytest.approx([2 / 4, 1 / 4, 2 / 4, 1 / 4])


def test_consensus_is_registered_and_its_diagnostics_log_under_its_name():
    combined = rewards.build_combined([{"name": "consensus", "weight": 0.9},
                                       {"name": "format", "weight": 0.1}])
    (first, *_) = combined.score(Example(id="q", prompt="p", answer="3"),
                                 [ans("3"), ans("3"), ans("4"), "none"])
    assert first["consensus/majority_correct"] == 1.0 and first["consensus/agree_frac"] == 0.5
    assert first["overall"] == pytest.approx(0.9 * 5 / 6 + 0.1 * first["format"])
    with pytest.raises(ValueError, match="contrast_weight"):
        rewards.get("consensus", contrast_weight=-1)


def test_answer_span_is_the_content_of_the_last_closed_answer_or_box():
    text = "<answer>1</answer> then <answer> 2 </answer>"
    assert text[slice(*answer_span(text))] == " 2 "
    assert text[slice(*answer_span(text, include_tags=True))] == "<answer> 2 </answer>"
    boxed = r"so \boxed{1} and \boxed{x^{2}} done"
    assert boxed[slice(*answer_span(boxed))] == "x^{2}"
    assert answer_span("<answer>3") is None and answer_span(r"\boxed{3") is None
    assert answer_span("the answer is 3") is None
    bare = r"so it is \boxed 5 then"                       # a bare box: the verifier reads "5"
    assert bare[slice(*answer_span(bare))] == "5" and extract_answer(bare) == "5"
    # an earlier box never closed: extraction fails closed, so nothing is masked either
    assert answer_span(r"\boxed{a and \boxed{5}") is None and extract_answer(r"\boxed{a and \boxed{5}") is None


@pytest.mark.parametrize("text", [
    "<think>x</think><answer> 12 </answer>", "<answer>A</answer><answer>(B)</answer>",
    r"<answer>it is \boxed{7}</answer>", r"so \boxed{\frac{1}{2}}", r"\fbox{3} and \boxed {4}",
    "<ANSWER>yes</ Answer >", r"\boxed 9", "<answer> </answer>", r"\boxed{} x",
])
def test_the_masked_span_holds_what_the_verifier_extracts(text):
    """One function for both: whatever `extract_answer` returns lies inside the span."""
    span, answer = answer_span(text), extract_answer(text)
    assert span is not None
    if answer is not None:
        assert answer in text[slice(*span)]


def test_answer_tokens_get_weight_zero_on_the_tiny_tokenizer(policy):
    tok = policy.tokenizer
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    eos = policy.eos_ids[0]
    # row 0: <answer> content; row 1: a nested box, right padded; row 2: multi-byte characters
    parts = [("<think>two circles</think> <answer>", "3", "</answer>"),
             (r"so \boxed{", "x^{2}", "} done"),
             ("<think>é</think><answer>", "ñ 12", "</answer>")]
    rows, want = [], []
    for head, answer, tail in parts:
        ids = enc(head) + enc(answer) + enc(tail) + [eos]
        rows.append(ids)
        want.append(list(range(len(enc(head)), len(enc(head)) + len(enc(answer)))))
    C = max(map(len, rows)) + 3
    ids = torch.full((3, C), policy.pad_id)
    mask = torch.zeros(3, C, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = torch.tensor(row)
        mask[r, :len(row)] = 1
    masked = answer_token_mask(tok, ids, mask)
    assert [m.nonzero().flatten().tolist() for m in masked] == want
    assert tok.decode(ids[0][masked[0]]) == "3" and tok.decode(ids[2][masked[2]]) == "ñ 12"

    (om,) = build([{"name": "om_grpo"}])
    roll = SimpleNamespace(completion_ids=ids, texts=[], group_size=3)
    adv = torch.tensor([1.0, -0.5, 0.25])
    credit, stats = token_credit(adv, mask, 0.2, 0.28, [om],
                                 ShapeContext(roll, [], mask, policy=policy))
    assert torch.equal(credit.weights, (~masked).float())       # not rescaled
    assert stats["shaping/om_grpo/masked_frac"] == pytest.approx(sum(map(len, want)) / mask.sum().item())
    assert stats["shaping/om_grpo/rows_masked_frac"] == 1.0
    logp = torch.randn(3, C, requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), mask=mask, **credit.rows([0, 1, 2], C))
    (grad,) = torch.autograd.grad(loss, logp)
    assert (grad[masked] == 0).all() and (grad[mask.bool() & ~masked] != 0).all()


def test_om_grpo_without_an_answer_span_is_plain_grpo_bit_for_bit(policy):
    ids = torch.tensor([policy.tokenizer("no tags here", add_special_tokens=False)["input_ids"]])
    mask = torch.ones_like(ids)
    (om,) = build([{"name": "om_grpo"}])
    roll = SimpleNamespace(completion_ids=ids, texts=[], group_size=1)
    credit, stats = token_credit(torch.tensor([0.7]), mask, 0.2, 0.28, [om],
                                 ShapeContext(roll, [], mask, policy=policy))
    assert stats["shaping/om_grpo/masked_frac"] == 0.0
    logp = torch.randn(ids.shape, generator=torch.Generator().manual_seed(0))
    old = logp + 0.05
    plain, _ = grpo_loss(logp, old, torch.tensor([0.7]), mask)
    shaped, _ = grpo_loss(logp, old, mask=mask, **credit.rows([0], ids.shape[1]))
    assert torch.equal(plain, shaped)
    with pytest.raises(ValueError, match="tokenizer"):
        om.shape(credit, ShapeContext(roll, [], mask))
    with pytest.raises(TypeError, match="include_tags"):
        build([{"name": "om_grpo", "include_tags": "yes"}])


def test_a_grpo_step_with_consensus_and_the_answer_mask(tmp_path, tiny_vl, shapes_dir, monkeypatch):
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=8",
                             "train.batch_prompts=2", "train.steps=1", "optim.lr=1e-2",
                             f"train.out_dir={tmp_path / 'run'}"])
    cfg.rewards = [{"name": "consensus", "weight": 0.9}, {"name": "format", "weight": 0.1}]
    cfg.algo.shaping = [{"name": "om_grpo"}]
    run, _ = build_run(cfg)
    tok, eos, pad = run.policy.tokenizer, run.policy.eos_ids[0], run.policy.pad_id
    # a random tiny model never writes answer tags: script the completions the engine returns
    group = [ans("3"), ans("3"), ans("4"), "<think>count</think> no idea"]
    encoded = [tok(t, add_special_tokens=False)["input_ids"] + [eos] for t in group]
    answer_tokens = [len(tok("3", add_special_tokens=False)["input_ids"])] * 2 + \
        [len(tok("4", add_special_tokens=False)["input_ids"]), 0]
    generate = run.engine.generate

    def scripted(prompts, params):
        real = generate(prompts, params)
        rows = encoded * len(prompts)
        ids = torch.full((len(rows), max(map(len, rows))), pad)
        mask = torch.zeros_like(ids)
        for r, row in enumerate(rows):
            ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
        return dataclasses.replace(real, completion_ids=ids, completion_mask=mask,
                                   sample_logprobs=None, texts=group * len(prompts))

    monkeypatch.setattr(run.engine, "generate", scripted)
    metrics = grpo_step(run, 1)
    assert metrics["reward/consensus/soft"] == pytest.approx((2 / 3 + 2 / 3 + 1 / 3 + 0) / 4)
    assert metrics["reward/consensus/agree_frac"] == 0.5
    assert metrics["reward/consensus/majority_correct"] in (0.0, 0.5, 1.0)
    assert metrics["shaping/om_grpo/masked_frac"] == pytest.approx(
        sum(answer_tokens) / sum(map(len, encoded)))
    assert metrics["shaping/om_grpo/rows_masked_frac"] == 0.75
    assert metrics["optim/grad_norm"] > 0 and metrics["update/skipped"] == 0.0
