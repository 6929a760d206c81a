"""Cliff (mmrlvr.methods.cliff.shaper): the first mistake found by StructReward's alignment or a teacher,
mapped to tokens by hand on the tiny tokenizer, the http judge against a local stand-in
(timeouts and malformed replies counted), and one GRPO step on the tiny Qwen2.5-VL."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import ClassVar

import pytest
import torch

import rewards
from mmrlvr.methods.cliff.shaper import (
    Cliff,
    HttpJudge,
    JudgeError,
    cliff_token,
    parse_step_number,
)
from mmrlvr.core.types import Scores
from mmrlvr.algo.shaping import ShapeContext, build, token_credit
from mmrlvr.data import Example

EX = Example(id="c1", prompt="How many shapes are in the image?", answer="3",
             steps=["There are 2 red circles.", "There is 1 blue square.", "2 + 1 = 3"])
RIGHT = ("<think>Step 1: There are 2 red circles.\nStep 2: There is 1 blue square.\n"
         "Step 3: 2 + 1 = 3</think><answer>3</answer>")
WRONG = ("<think>Step 1: There are 2 red circles.\nStep 2: There are 3 blue squares.\n"
         "Step 3: 2 + 3 = 5</think><answer>5</answer>")          # step 2 is the first mistake


# ----------------------------------------------------------------------------- the rule judge

def test_first_mistake_is_the_step_after_the_in_order_matched_prefix():
    steps = rewards.get("struct_steps")
    assert WRONG.index("Step 2") == 40
    assert steps.first_mistake(EX, WRONG) == 40                          # its marker included
    assert steps.first_mistake(EX, RIGHT) is None                        # every step matched
    assert steps.first_mistake(EX, RIGHT.replace("<answer>3", "<answer>4")) is None
    third = RIGHT.replace("2 + 1 = 3<", "2 + 1 = 4<")
    assert steps.first_mistake(EX, third) == third.index("Step 3")
    # a step the references lack is tolerated while the next reference step follows
    chatty = "<think>Let me look closely. There are 2 red circles. I count 5 squares.</think>"
    assert steps.first_mistake(EX, chatty) == chatty.index("I count")
    short = "<think>There are 2 red circles.</think><answer>2</answer>"   # stops early
    assert steps.first_mistake(EX, short) == short.index("</think>")
    assert steps.first_mistake(EX, "The answer is 4") == 0
    assert steps.first_mistake(Example(id="n", prompt="q", answer="3"), WRONG) is None
    found, starts, tail = steps.located_steps(WRONG)
    assert starts == [7, 40, WRONG.index("Step 3")] and len(found) == 3
    assert tail == WRONG.index("</think>")


def _rollouts(tokenizer, texts, group_size, pad=2):
    """Rollouts as the HF engine builds them: ids + EOS, right padded, texts decoded back."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    width = max(map(len, rows)) + pad
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = torch.tensor(row), 1
    decoded = tokenizer.batch_decode(rows, skip_special_tokens=True)
    assert decoded == texts
    return SimpleNamespace(texts=texts, group_size=group_size, completion_ids=ids), mask


def _ctx(policy, texts, correct, group_size, examples):
    roll, mask = _rollouts(policy.tokenizer, texts, group_size)
    scores = [[{"overall": c, "accuracy": c} for c in correct[b:b + group_size]]
              for b in range(0, len(texts), group_size)]
    return ShapeContext(roll, scores, mask, examples, None,
                        SimpleNamespace(tokenizer=policy.tokenizer)), mask


def test_tokens_before_the_wrong_step_get_the_rollouts_advantage_flipped(policy):
    tok = policy.tokenizer
    pieces = [tok.decode([i]) for i in tok(WRONG, add_special_tokens=False)["input_ids"]]
    assert pieces[:14] == ["<think", ">", "Step", " ", "1", ":", " There", " are", " ", "2",
                           " red", " circles", ".\n", "Step"]    # token 13 opens "Step 2"
    n_wrong = len(pieces) + 1                                    # + EOS
    ctx, mask = _ctx(policy, [RIGHT, WRONG], [1.0, 0.0], 2, [EX])
    (cliff,) = build([{"name": "cliff"}])
    credit, stats = token_credit(torch.tensor([0.5, -0.5]), mask, 0.2, 0.28, [cliff], ctx)
    adv = credit.advantages                                                     # [2, C]
    assert adv.shape == mask.shape
    assert torch.equal(adv[0], torch.full_like(adv[0], 0.5))                    # correct: as is
    want = torch.full_like(adv[1], -0.5)
    want[:13] = 0.5                                  # "<think>Step 1: ... circles.\n" -> +|A|
    assert torch.equal(adv[1], want)                 # "Step 2" on, EOS and padding: A
    assert stats["shaping/cliff/judged"] == 1.0 and stats["shaping/cliff/found_frac"] == 1.0
    assert stats["shaping/cliff/cliff_pos_mean"] == pytest.approx(13 / n_wrong)
    assert stats["shaping/cliff/shaped_abs_delta"] == pytest.approx(13 * 1.0 / n_wrong)
    assert stats["shaping/cliff/mean_abs_delta_adv"] == pytest.approx(13 / int(mask.sum()))

    (scaled,) = build([{"name": "cliff", "before": 0.5, "after": 2.0}])
    credit, _ = token_credit(torch.tensor([0.5, -0.5]), mask, 0.2, 0.28, [scaled], ctx)
    n = int(mask[1].sum())
    assert credit.advantages[1, :13].tolist() == [0.25] * 13
    assert credit.advantages[1, 13:n].tolist() == [-1.0] * (n - 13)
    assert credit.advantages[1, n:].tolist() == [-0.5] * (mask.shape[1] - n)   # padding kept


def test_correct_positive_and_mistake_free_rollouts_keep_their_advantage(policy):
    wrong_answer = RIGHT.replace("<answer>3", "<answer>4")       # every step right: no cliff
    texts = [WRONG, wrong_answer, WRONG, RIGHT, WRONG]
    ctx, mask = _ctx(policy, texts, [0.0, 0.0, 0.0, 1.0, 0.0], 5, [EX])
    adv = torch.tensor([0.3, -0.2, -0.4, 0.3, 0.0])  # row 0: wrong but A > 0 (another reward)
    (cliff,) = build([{"name": "cliff"}])
    credit, stats = token_credit(adv, mask, 0.2, 0.28, [cliff], ctx)
    plain = adv.unsqueeze(1).expand_as(mask)
    for r in (0, 1, 3, 4):                           # A = 0: not even sent to the judge
        assert torch.equal(credit.advantages[r], plain[r])
    assert credit.advantages[2, :13].tolist() == [pytest.approx(0.4)] * 13
    assert stats["shaping/cliff/judged"] == 2.0 and stats["shaping/cliff/found_frac"] == 0.5


def test_cliff_token_maps_offsets_through_prefix_decodes(policy):
    tok = policy.tokenizer
    ids = tok("ab cd", add_special_tokens=False)["input_ids"]
    ends = [len(tok.decode(ids[:k + 1])) for k in range(len(ids))]
    for offset in range(6):
        assert cliff_token(tok, ids, offset) == next((k for k, e in enumerate(ends) if e > offset),
                                                     len(ids))
    assert cliff_token(tok, ids, 0) == 0 and cliff_token(tok, ids, 99) == len(ids)


@pytest.mark.parametrize("options, message", [
    ({"judge": "oracle"}, "judge must be one of"), ({"before": -1}, "before and after"),
    ({"judge": "http", "url": "http://127.0.0.1:9"}, "needs `url`"),
    ({"judge": "model"}, "needs `path`")])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        build([{"name": "cliff", **options}])


def test_a_missing_correct_key_names_the_option(policy):
    ctx, mask = _ctx(policy, [RIGHT, WRONG], [1.0, 0.0], 2, [EX])
    ctx.scores = Scores([[{"overall": 1.0}, {"overall": 0.0}]])
    (cliff,) = build([{"name": "cliff"}])
    with pytest.raises(KeyError, match=r"correct_key 'accuracy'.*struct_steps/acc"):
        token_credit(torch.tensor([0.5, -0.5]), mask, 0.2, 0.28, [cliff], ctx)


# ----------------------------------------------------------------------------- the http judge

class _Teacher(BaseHTTPRequestHandler):
    """An OpenAI-compatible stand-in: the requested `model` picks the behaviour."""

    seen: ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Teacher.seen.append((self.path, body))
        mode = body["model"]
        if mode == "slow":
            time.sleep(60)               # past any timeout the tests give: only a timeout ends it
        if mode == "garbage":
            payload = b"<html>not json</html>"
        else:
            content = {"good": "Step 2", "none": "0", "prose": "the second one",
                       "slow": "2", "range": "7"}[mode]
            payload = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except OSError:                  # the client gave up (timeout)
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def teacher():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Teacher)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Teacher.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_http_judge_asks_for_the_step_number_and_maps_it_to_the_step(teacher):
    judge = HttpJudge(teacher, "good", timeout_s=5)
    assert judge.first_mistake(EX, WRONG) == 40
    path, body = _Teacher.seen[-1]
    assert path == "/v1/chat/completions" and body["temperature"] == 0
    prompt = body["messages"][0]["content"]
    assert "2. There are 3 blue squares." in prompt and "- There is 1 blue square." in prompt
    assert HttpJudge(teacher, "none").first_mistake(EX, WRONG) is None
    assert parse_step_number("3.", 3) == 3
    for mode, kind in (("prose", "malformed"), ("range", "malformed"), ("garbage", "malformed")):
        with pytest.raises(JudgeError) as e:
            HttpJudge(teacher, mode).first_mistake(EX, WRONG)
        assert e.value.kind == kind, mode
    t0 = time.perf_counter()
    with pytest.raises(JudgeError) as e:
        HttpJudge(teacher, "slow", timeout_s=0.3).first_mistake(EX, WRONG)
    assert e.value.kind == "timeout" and time.perf_counter() - t0 < 30   # not the 60 s reply
    with pytest.raises(JudgeError) as e:
        HttpJudge("http://127.0.0.1:1/v1", "good", timeout_s=1).first_mistake(EX, WRONG)
    assert e.value.kind == "http"


def test_http_failures_are_counted_and_stop_after_max_failures(policy, teacher):
    texts = [RIGHT] + [WRONG] * 5
    ctx, mask = _ctx(policy, texts, [1.0] + [0.0] * 5, 6, [EX])
    adv = torch.tensor([1.0] + [-0.2] * 5)
    slow = Cliff(judge="http", url=teacher, model="slow", timeout_s=0.3, max_failures=2)
    t0 = time.perf_counter()
    credit, stats = token_credit(adv, mask, 0.2, 0.28, [slow], ctx)
    assert time.perf_counter() - t0 < 30          # 2 timeouts, then skipped: no 60 s reply waited
    assert stats["shaping/cliff/fail_timeout"] == 2.0 and stats["shaping/cliff/judge_skipped"] == 3
    assert stats["shaping/cliff/found_frac"] == 0.0
    assert torch.equal(credit.advantages, adv.unsqueeze(1).expand_as(mask))   # nothing shaped
    bad = Cliff(judge="http", url=teacher, model="prose")
    _, stats = token_credit(adv, mask, 0.2, 0.28, [bad], ctx)
    assert stats["shaping/cliff/fail_malformed"] == 3.0 and stats["shaping/cliff/judged"] == 5
    good = Cliff(judge="http", url=teacher, model="good")
    credit, stats = token_credit(adv, mask, 0.2, 0.28, [good], ctx)
    assert stats["shaping/cliff/found_frac"] == 1.0 and stats["shaping/cliff/judge_failures"] == 0
    assert credit.advantages[1, :13].tolist() == [pytest.approx(0.2)] * 13


def test_model_judge_counts_a_random_teachers_replies(policy, tiny_vl):
    texts = [RIGHT, WRONG]
    ctx, mask = _ctx(policy, texts, [1.0, 0.0], 2, [EX])
    judge = Cliff(judge="model", path=str(tiny_vl), max_new_tokens=4)
    _, stats = token_credit(torch.tensor([0.5, -0.5]), mask, 0.2, 0.28, [judge], ctx)
    assert stats["shaping/cliff/judged"] == 1.0      # a random model: a verdict or a failure
    assert stats["shaping/cliff/found_frac"] + stats["shaping/cliff/judge_failures"] <= 1.0


# ----------------------------------------------------------------------------- end to end

def _scripted(engine, tokenizer):
    """`engine.generate`, then its completions replaced by scripted ones per example: member 0
    the reference solution, the others its first reference step then a wrong one."""
    from dataclasses import replace

    from mmrlvr.tasks.shapes import reference_completion

    generate = engine.generate

    def scripted(prompts, params):
        out = generate(prompts, params)
        texts = []
        for ex in prompts.examples:
            wrong = f"<think>{ex.steps[0]}\nI see 7 purple stars.</think><answer>zebra</answer>"
            texts += [reference_completion(ex)] + [wrong] * (out.group_size - 1)
        roll, mask = _rollouts(tokenizer, texts, out.group_size, pad=0)
        stats = {k: v for k, v in out.stats.items() if k.startswith("rollout/")}
        return replace(out, completion_ids=roll.completion_ids, completion_mask=mask,
                       sample_logprobs=None, texts=texts, stats=stats)
    return scripted


def test_a_grpo_step_with_the_rule_judge_on_the_steps_data(tmp_path, tiny_vl, shapes_dir):
    from mmrlvr.config import load_config
    from mmrlvr.train.setup import build_run
    from mmrlvr.train.trainer import grpo_step

    cfg = load_config(None, [f"model.path={tiny_vl}", f"data.train={shapes_dir / 'train.jsonl'}",
                             "rollout.group_size=4", "rollout.max_new_tokens=8",
                             "train.batch_prompts=2", "train.steps=1", "optim.lr=1e-2",
                             f"train.out_dir={tmp_path / 'run'}"])
    cfg.rewards = [{"name": "struct_steps", "weight": 1.0}, {"name": "accuracy", "weight": 0.0}]
    cfg.algo.shaping = [{"name": "cliff", "judge": "rule"}]
    run, _ = build_run(cfg)
    run.engine.generate = _scripted(run.engine, run.policy.tokenizer)
    metrics = grpo_step(run, 1)
    assert [s.name for s in run.shapers] == ["cliff"]
    assert metrics["reward/accuracy"] == pytest.approx(1 / 4)             # member 0 of each
    assert metrics["shaping/cliff/judged"] == 2 * 3                       # every wrong member
    assert metrics["shaping/cliff/found_frac"] == 1.0                     # at "I see 7 ..."
    assert 0.2 < metrics["shaping/cliff/cliff_pos_mean"] < 0.8
    assert metrics["shaping/cliff/mean_abs_delta_adv"] > 0
    assert metrics["optim/grad_norm"] > 0 and metrics["update/skipped"] == 0.0
