"""AudioRubrics: acoustic evidence, static rubrics, rubric evolution, judges, fallback, audit log."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import numpy as np
import pytest
import soundfile as sf

import rewards
from mmrlvr.data import Example
from mmrlvr.methods.audio_rubrics.evidence import extract_evidence, order_facts, static_rubrics
from mmrlvr.methods.audio_rubrics.reward import AudioRubricsReward
from mmrlvr.methods.audio_rubrics.judges import (
    JudgeError,
    LLMJudge,
    Rubric,
    RuleJudge,
    numbers_in,
    order_claims,
    parse_json,
)

SR = 16000


def tone(freq, seconds, amp=0.5):
    t = np.arange(int(SR * seconds)) / SR
    wave = amp * np.sin(2 * np.pi * freq * t)
    ramp = int(0.01 * SR)
    wave[:ramp] *= np.linspace(0, 1, ramp)
    wave[-ramp:] *= np.linspace(1, 0, ramp)
    return wave


def silence(seconds):
    return np.zeros(int(SR * seconds))


def clip(*parts):
    return np.concatenate(parts).astype(np.float32)


# -- evidence ---------------------------------------------------------------------------------
def test_evidence_recovers_known_pitch_onsets_and_durations():
    wave = clip(silence(0.2), tone(440, 0.3), silence(0.25), tone(880, 0.5), silence(0.2),
                tone(660, 0.15), silence(0.4))
    ev = extract_evidence(wave, SR)
    assert ev["duration_s"] == pytest.approx(2.0)
    assert ev["onset_count"] == 3
    assert ev["onset_times_s"] == pytest.approx([0.2, 0.75, 1.45], abs=0.01)
    assert [e["duration_s"] for e in ev["events"]] == pytest.approx([0.3, 0.5, 0.15], abs=0.01)
    assert [e["pitch_hz"] for e in ev["events"]] == pytest.approx([440, 880, 660], rel=0.01)
    assert ev["pitch"]["median_hz"] == pytest.approx(660, rel=0.02)     # median over sounding frames
    assert ev["tempo"]["bpm"] == pytest.approx(60 / 0.625, rel=0.02)   # median inter-onset 0.625 s
    assert ev["spectral_centroid_hz"] == pytest.approx(660, rel=0.15)
    assert order_facts(ev) == {"pitch": "second", "duration": "first"}  # first vs last event
    json.dumps(ev)                                                      # plain JSON values


def test_evidence_loudness_halves_and_tempo_rates():
    loud_quiet = clip(tone(500, 1.0, 0.5), tone(500, 1.0, 0.5 * 10 ** (-12 / 20)))
    ev = extract_evidence(loud_quiet, SR)
    assert ev["loudness"]["first_half_db"] - ev["loudness"]["second_half_db"] == pytest.approx(12, abs=1)
    assert order_facts(ev) == {"loudness": "first"}
    clicks = silence(2.0)
    for t in [0.05, 0.45, 0.85] + [1.05 + k * 0.15 for k in range(6)]:
        i = int(t * SR)
        clicks[i:i + 160] += 0.5 * np.exp(-np.arange(160) / 40)
    ev = extract_evidence(clicks.astype(np.float32), SR)
    assert ev["onset_count"] == 9
    assert (ev["tempo"]["first_half_rate"], ev["tempo"]["second_half_rate"]) == (3.0, 6.0)
    assert order_facts(ev)["tempo"] == "second"
    assert extract_evidence(np.zeros(SR, dtype=np.float32), SR)["onset_count"] == 0


def test_static_rubrics_put_the_asked_fact_first_and_weigh_to_one():
    ev = extract_evidence(clip(silence(0.1), tone(300, 0.5), silence(0.3), tone(700, 0.5)), SR)
    rubrics = static_rubrics([ev], "Which tone is higher in pitch?")
    assert 2 <= len(rubrics) <= 5
    assert rubrics[0]["check"] == {"kind": "order", "attribute": "pitch", "winner": "second"}
    assert "300" in rubrics[0]["criterion"] and "700" in rubrics[0]["criterion"]
    assert sum(r["weight"] for r in rubrics) == pytest.approx(1.0)
    assert all(r["polarity"] == 1 and r["category"] for r in rubrics)
    counting = static_rubrics([ev], "How many beeps are there?")
    assert counting[0]["check"] == {"kind": "count", "value": 2}


def test_claims_are_read_from_the_reasoning():
    assert order_claims("The second tone is higher.") == {("pitch", "second")}
    assert order_claims("The first one is lower than the second") == {("pitch", "second")}
    assert order_claims("It is louder than the second half.") == {("loudness", "first")}
    assert order_claims("The second pattern is slower. The first tone is longer") == {
        ("tempo", "first"), ("duration", "first")}
    assert numbers_in("I hear three beeps, not 4.") == {3, 4}


# -- rubric evolution -----------------------------------------------------------------------------
class Scripted:
    """A judge that answers from a script (or fails on demand)."""

    name = "scripted"

    def __init__(self, new, verdicts, weights=None, fail=None):
        self.new, self.verdicts, self.weights, self.fail = new, verdicts, weights, fail

    def evaluate(self, ctx, rubrics, max_new):
        if self.fail == "evaluate":
            raise JudgeError("judge down")
        return list(self.new), self.verdicts

    def weigh(self, ctx, rubrics):
        if self.fail == "weigh":
            raise JudgeError("no weights")
        return self.weights[:len(rubrics)] if self.weights else [1.0] * len(rubrics)


def _example(**meta):
    rubrics = [{"id": f"s{k}", "category": "perception", "criterion": f"static {k}", "weight": w,
                "polarity": 1, "check": {"kind": "count", "value": k}}
               for k, w in ((1, 0.5), (2, 0.3), (3, 0.2))]
    return Example(id="ex", prompt="How many beeps?\nA. 1\nB. 2\nC. 3", answer="B",
                   choices=["1", "2", "3"], meta={"evidence": [{}], "rubrics": rubrics, **meta})


GROUP = ["<think>I hear 2 beeps.</think><answer>B</answer>",
         "<think>I hear 1 beep.</think><answer>A</answer>",
         "<think>I hear 3 beeps and 2.</think><answer>C</answer>",
         "<answer>B</answer>"]


def _reward(judge, **kw):
    reward = AudioRubricsReward(**kw)
    reward.judge = judge
    return reward


def test_evolution_flips_negatives_drops_zero_spread_and_keeps_top_k(tmp_path):
    new = [Rubric("p1", "reasoning", "claims a wrong count", polarity=-1),
           Rubric("p2", "style", "always true"),
           Rubric("p3", "perception", "rare")]
    verdicts = [[1, 0, 1, 0],    # s1: std 0.5
                [1, 1, 1, 0],    # s2: std 0.433
                [0, 0, 0, 0],    # s3: zero spread -> dropped
                [0, 1, 1, 0],    # p1 negative -> flipped to [1, 0, 0, 1]: std 0.5
                [1, 1, 1, 1],    # p2: zero spread -> dropped
                [1, 0, 0, 0]]    # p3: std 0.433
    reward = _reward(Scripted(new, verdicts, weights=[4.0, 3.0, 2.0, 1.0]), top_k=3,
                     log_path=str(tmp_path / "rubrics.jsonl"))
    scores = reward.score(_example(), GROUP)
    row = json.loads((tmp_path / "rubrics.jsonl").read_text().splitlines()[0])
    kept = [r["id"] for r in row["rubrics"] if r["kept"]]
    assert kept == ["s1", "s2", "p1"]                 # top 3 by std (ties keep the earlier one)
    p1 = next(r for r in row["rubrics"] if r["id"] == "p1")
    assert p1["satisfied"] == [1.0, 0.0, 0.0, 1.0] and p1["verdicts"] == [False, True, True, False]
    weights = [r["weight"] for r in row["rubrics"] if r["kept"]]
    assert weights == pytest.approx([4 / 9, 3 / 9, 2 / 9]) and sum(weights) == pytest.approx(1)
    expected = [4 / 9 * s1 + 3 / 9 * s2 + 2 / 9 * p for s1, s2, p in
                zip([1, 0, 1, 0], [1, 1, 1, 0], [1, 0, 0, 1])]
    assert [s["rubric"] for s in scores] == pytest.approx(expected)
    assert row["source"] == "evolved" and row["correct"] == [True, False, False, True]
    assert scores[0]["overall"] == pytest.approx(
        0.9 * 1 + 0.1 * 1 + 0.5 * expected[0] + 0.1 * (1 - 5 / 256))   # "I hear 2 beeps." = 5 tokens


def test_weight_failure_is_uniform_and_no_rubric_left_is_one_half():
    verdicts = [[1, 0, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
    scores = _reward(Scripted([], verdicts, fail="weigh")).score(_example(), GROUP)
    assert [s["rubric"] for s in scores] == pytest.approx([1.0, 0.5, 1.0, 0.0])
    flat = _reward(Scripted([], [[1] * 4, [0] * 4, [1] * 4])).score(_example(), GROUP)
    assert [s["rubric"] for s in flat] == [0.5] * 4 and flat[0]["rubrics_kept"] == 0


def test_judge_failure_falls_back_to_the_static_rubrics(tmp_path):
    reward = _reward(Scripted([], [], fail="evaluate"), log_path=str(tmp_path / "log.jsonl"))
    scores = reward.score(_example(), GROUP)
    # static weights 0.5/0.3/0.2 on "states 1/2/3 as the count", judged by the rule-based checks;
    # "I hear 3 beeps and 2." states 3 (the bare "2" is no count: it scored 0.5 when any number did)
    assert [s["rubric"] for s in scores] == pytest.approx([0.3, 0.5, 0.2, 0.0])
    assert all(s["fallback"] == 1.0 for s in scores)
    row = json.loads((tmp_path / "log.jsonl").read_text())
    assert row["source"] == "static_fallback" and "judge down" in row["error"]
    bad_shape = _reward(Scripted([], [[1, 0]])).score(_example(), GROUP)     # wrong verdict shape
    assert bad_shape[0]["fallback"] == 1.0


def test_reward_stays_in_bounds_on_any_group():
    rng = np.random.default_rng(0)
    words = ["<think>", "</think>", "<answer>", "</answer>", "B", "A", "2", "beeps", "the", "second",
             "higher", "first", "louder", "x" * 300]
    reward = rewards.get("audio_rubrics")
    ev = extract_evidence(clip(silence(0.1), tone(300, 0.4), silence(0.3), tone(600, 0.4)), SR)
    ex = Example(id="b", prompt="Which tone is higher?\nA. first\nB. second", answer="B",
                 choices=["first", "second"],
                 meta={"evidence": [ev], "rubrics": static_rubrics([ev], "Which tone is higher?")})
    for _ in range(30):
        group = [" ".join(rng.choice(words, size=rng.integers(0, 12))) for _ in range(6)]
        for s in reward.score(ex, group):
            assert 0.0 <= s["rubric"] <= 1.0 and 0.0 <= s["brevity"] <= 1.0
            assert 0.0 <= s["overall"] <= reward.max_total == pytest.approx(1.6)


def test_rule_judge_proposes_from_correct_versus_wrong_against_the_evidence():
    ev = extract_evidence(clip(silence(0.1), tone(300, 0.5), silence(0.3), tone(700, 0.5)), SR)
    ex = Example(id="p", prompt="Which tone is higher?\nA. the first tone\nB. the second tone",
                 answer="B", choices=["the first tone", "the second tone"],
                 meta={"evidence": [ev], "rubrics": []})
    group = ["<think>The second tone is higher.</think><answer>B</answer>",
             "<think>The first tone is higher.</think><answer>A</answer>",
             "<think>The first tone is higher.</think><answer>A</answer>",
             "<think>The second one is higher.</think><answer>B</answer>"]
    reward = AudioRubricsReward(max_proposals=3)
    scores = reward.score(ex, group)
    proposed = RuleJudge().propose(reward.judge_context(ex, group), [], 3)
    assert {(r.polarity, r.check["winner"]) for r in proposed} == {(1, "second"), (-1, "first")}
    assert [s["rubric"] for s in scores] == pytest.approx([1.0, 0.0, 0.0, 1.0])


# -- the LLM judge ------------------------------------------------------------------------------
class _Handler(BaseHTTPRequestHandler):
    replies: ClassVar[list] = []
    seen: ClassVar[list] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        content = self.replies.pop(0) if self.replies else "not json"
        out = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture()
def judge_server():
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_http_llm_judge_retries_then_scores(judge_server):
    _Handler.seen.clear()
    _Handler.replies[:] = [
        "sorry, no",                                                     # unusable: retried
        ('```json\n{"new_rubrics": [{"category": "reasoning", "criterion": "guesses", '
         '"polarity": "negative"}], "verdicts": [[1,0,0,1],[1,1,0,1],[0,0,0,0],[0,1,1,0]]}\n```'),
        '{"weights": [2, 1, 1]}']
    reward = AudioRubricsReward(judge={"kind": "http", "url": judge_server, "model": "judge",
                                       "timeout_s": 5, "retries": 1, "audio": False})
    reward.judge.backoff_s = 0.0
    scores = reward.score(_example(), GROUP)
    assert len(_Handler.seen) == 3 and _Handler.seen[0]["model"] == "judge"
    prompt = _Handler.seen[0]["messages"][1]["content"]
    assert "Gold answer: B" in prompt and "R2 (wrong): I hear 1 beep." in prompt
    # kept: s1 [1,0,0,1], s2 [1,1,0,1], p1 flipped [1,0,0,1]; weights 2:1:1
    assert [s["rubric"] for s in scores] == pytest.approx([1.0, 0.25, 0.0, 1.0])
    assert scores[0]["fallback"] == 0.0


def test_http_llm_judge_failure_falls_back(judge_server):
    _Handler.replies[:] = []                                             # only garbage
    reward = AudioRubricsReward(judge={"kind": "http", "url": judge_server, "retries": 1,
                                       "audio": False})
    reward.judge.backoff_s = 0.0
    assert all(s["fallback"] == 1.0 for s in reward.score(_example(), GROUP))
    dead = AudioRubricsReward(judge={"kind": "http", "url": "http://127.0.0.1:9", "timeout_s": 0.5,
                                     "retries": 0, "audio": False})
    assert dead.score(_example(), GROUP)[1]["fallback"] == 1.0


def test_llm_judge_rejects_mismatched_verdicts_and_parses_json():
    judge = LLMJudge(lambda messages: '{"new_rubrics": [], "verdicts": [[1, 0]]}', retries=0)
    ex_rubrics = [Rubric("s1", "perception", "x")]
    reward = AudioRubricsReward()
    with pytest.raises(JudgeError, match="verdict rows"):
        judge.evaluate(reward.judge_context(_example(), GROUP), ex_rubrics, 3)
    assert parse_json('noise {"a": {"b": 1}} tail') == {"a": {"b": 1}}
    with pytest.raises(JudgeError):
        parse_json("{broken")


def test_evidence_is_computed_from_the_file_when_the_row_has_none(tmp_path):
    sf.write(tmp_path / "two.wav", clip(silence(0.1), tone(400, 0.3), silence(0.3), tone(400, 0.3)), SR)
    ex = Example(id="f", prompt="How many beeps are there?\nA. 1\nB. 2", answer="B",
                 choices=["1", "2"], audios=[str(tmp_path / "two.wav")])
    reward = AudioRubricsReward(judge={"kind": "rule"})
    ctx = reward.judge_context(ex, GROUP)
    assert ctx.evidence[0]["onset_count"] == 2
    assert reward.static_of(ex, ctx.evidence)[0].check == {"kind": "count", "value": 2}
