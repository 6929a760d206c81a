"""AudioRubrics with a writer and a judge that hear the audio: a scripted endpoint on 127.0.0.1
(a real HTTP server answering well-formed rubrics and verdicts, or garbage) pins the request
(the clip as an input_audio part), the strict parsing, the fail-closed scores and their counts,
the rubric cache and its reuse on resume, and the regeneration of criteria no rollout or every
rollout met."""
from __future__ import annotations

import base64
import io
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import numpy as np
import pytest
import soundfile as sf

from mmrlvr.data import Example
from mmrlvr.methods.audio_rubrics.heard import score_group
from mmrlvr.methods.audio_rubrics.judges import Rubric
from mmrlvr.methods.audio_rubrics.reward import AudioRubricsReward
from mmrlvr.methods.audio_rubrics.roles import parse_verdicts
from mmrlvr.methods.audio_rubrics.checks import JudgeError

SR = 16000
WRITTEN = {"rubrics": [
    {"criterion": "Hears the beeps [beep]", "category": "perception", "weight": 2, "polarity": "positive"},
    {"criterion": "Counts them [three]", "category": "perception", "weight": 1, "polarity": "positive"},
    {"criterion": "Mentions silence [silence]", "category": "grounding", "weight": 1, "polarity": "positive"}]}
REPLACEMENT = {"rubrics": [
    {"criterion": "Says it is evenly spaced [even]", "category": "reasoning", "weight": 1,
     "polarity": "positive"}]}
GROUP = ["<think>I hear three beep sounds, even.</think><answer>C</answer>",
         "<think>A beep, then more.</think><answer>B</answer>",
         "<think>three beep tones</think><answer>C</answer>",
         "<think>nothing here</think><answer>A</answer>"]


class Scripted(BaseHTTPRequestHandler):
    """Writer requests get `WRITTEN` (or `REPLACEMENT` when asked to replace); judge requests a
    verdict per criterion: whether the criterion's [keyword] is in the reasoning graded."""

    seen: ClassVar[list] = []
    broken: ClassVar[set] = set()          # "writer", "judge", "judge-once" (one garbage reply)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        user = body["messages"][1]["content"]
        text = user if isinstance(user, str) else user[-1]["text"]
        if '"verdicts"' in text:
            reasoning = text.split("Reasoning to grade:\n", 1)[1].split("\n\nTask:", 1)[0]
            listed = text.split("Criteria:\n", 1)[1].split("\n\nReasoning", 1)[0].splitlines()
            words = [re.findall(r"\[(\w+)\]", line) for line in listed]
            content = json.dumps({"verdicts": ["yes" if w and w[0] in reasoning else "no"
                                               for w in words]})
            if "judge" in self.broken or ("judge-once" in self.broken and "nothing" in reasoning):
                content = '{"verdicts": ["maybe"]}'
        else:
            content = json.dumps(REPLACEMENT if "to replace" in text else WRITTEN)
            if "writer" in self.broken:
                content = "I would write some rubrics."
        out = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture()
def url():
    Scripted.seen[:], Scripted.broken = [], set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def example(tmp_path):
    t = np.arange(int(0.15 * SR)) / SR
    beep = 0.5 * np.sin(2 * np.pi * 440 * t)
    gap = np.zeros(int(0.25 * SR))
    sf.write(tmp_path / "three.wav", np.concatenate([gap, beep, gap, beep, gap, beep, gap]), SR)
    return Example(id="ex1", prompt="How many beeps?\nA. 1\nB. 2\nC. 3", answer="C",
                   choices=["1", "2", "3"], audios=[str(tmp_path / "three.wav")])


def _reward(url, run_dir, **kw):
    spec = {"kind": "http", "url": url, "model": "hearer", "retries": 0, "concurrency": 2}
    return AudioRubricsReward(writer=spec, judge=spec, run_dir=str(run_dir),
                              log_path=str(run_dir / "rubrics.jsonl"), **kw)


def _log(run_dir):
    return [json.loads(line) for line in (run_dir / "rubrics.jsonl").read_text().splitlines()]


def test_writer_and_judge_hear_the_clip_and_score_each_criterion(url, example, tmp_path):
    reward = _reward(url, tmp_path, regenerate_every=0)
    scores = reward.score(example, GROUP, progress=0.0)
    writes = [b for b in Scripted.seen if '"rubrics"' in b["messages"][1]["content"][-1]["text"]]
    judged = [b for b in Scripted.seen if b not in writes]
    assert len(writes) == 1 and len(judged) == 4                        # one per rollout
    audio = writes[0]["messages"][1]["content"][0]
    assert audio["type"] == "input_audio" and audio["input_audio"]["format"] == "wav"
    wave, rate = sf.read(io.BytesIO(base64.b64decode(audio["input_audio"]["data"])))
    assert rate == SR and len(wave) == int(0.15 * SR) * 3 + int(0.25 * SR) * 4
    assert "Listen to the audio clip" in writes[0]["messages"][0]["content"]
    # beep [1,1,1,0] std .433, three [1,0,1,0] std .5 kept with weights 2:1 -> .5:.25 of the
    # written 0.5/0.25/0.25; silence [0,0,0,0] dropped
    expected = [(0.5 * b + 0.25 * t) / 0.75 for b, t in zip([1, 1, 1, 0], [1, 0, 1, 0])]
    assert [s["rubric"] for s in scores] == pytest.approx(expected)
    [row] = _log(tmp_path)
    assert row["source"] == "judged" and row["rubric_source"] == "written"
    assert [r["kept"] for r in row["rubrics"]] == [True, True, False]
    assert scores[0]["judge_malformed"] == 0.0 and scores[0]["writer_malformed"] == 0.0
    assert scores[0]["judge_s"] >= 0.0 and scores[0]["regenerated_frac"] == 0.0
    assert scores[0]["criterion_spread"] == pytest.approx((3 ** 0.5 / 4 + 0.5 + 0) / 3)


def test_criteria_no_rollout_meets_are_regenerated_and_reused_on_resume(url, example, tmp_path):
    reward = _reward(url, tmp_path, regenerate_every=2)
    reward.score(example, GROUP)                                          # step 1: no regeneration
    assert not any("to replace" in b["messages"][1]["content"][-1]["text"] for b in Scripted.seen)
    scores = reward.score(example, GROUP)                                 # step 2: regenerate
    asks = [b for b in Scripted.seen if "to replace" in b["messages"][1]["content"][-1]["text"]]
    assert len(asks) == 1
    prompt = asks[0]["messages"][1]["content"][-1]["text"]
    assert "Mentions silence [silence] (met by 0 of 4)" in prompt and "R4 (wrong): nothing here" in prompt
    assert scores[0]["regenerated_frac"] == pytest.approx(1 / 3)
    row = _log(tmp_path)[-1]
    assert row["replaced"] == ["w3"]
    new = [r["criterion"] for r in row["regenerated"]]
    assert new == ["Hears the beeps [beep]", "Counts them [three]", "Says it is evenly spaced [even]"]
    s_beep, s_three = 3 ** 0.5 / 4, 0.5                                  # reweighted ∝ σ
    weights = [r["weight"] for r in row["regenerated"]]
    mean = (s_beep + s_three) / (s_beep + s_three) / 2
    assert weights == pytest.approx(np.array([s_beep / (s_beep + s_three),
                                              s_three / (s_beep + s_three), mean]) / (1 + mean))
    third = reward.score(example, GROUP)                                  # step 3: the new set
    assert _log(tmp_path)[-1]["rubric_source"] == "regenerated"
    assert third[0]["rubric"] > third[1]["rubric"]                       # only R1 says "even"
    cache = [json.loads(line) for line in (tmp_path / "rubric_cache.jsonl").read_text().splitlines()]
    assert [(r["kind"], r.get("step")) for r in cache] == [("written", None), ("regenerated", 2)]
    assert cache[0]["key"] == "ex1|" + example.prompt and cache[0]["writer"].startswith("http:")

    calls = len(Scripted.seen)
    (tmp_path / "config.yaml").write_text("train:\n  steps: 10\n")        # what a run dir holds
    resumed = _reward(url, tmp_path, regenerate_every=2)
    assert resumed.total_steps == 10
    again = resumed.score(example, GROUP, progress=0.3)                   # step 3 after a resume
    assert len(Scripted.seen) == calls + 4                                # judged only: no writing
    assert _log(tmp_path)[-1]["rubric_source"] == "regenerated"
    assert [s["rubric"] for s in again] == pytest.approx([s["rubric"] for s in third])
    early = _reward(url, tmp_path, regenerate_every=2)                    # resumed from step 1:
    early.score(example, GROUP, progress=0.2)                             # the step-2 set is ahead
    assert _log(tmp_path)[-1]["rubric_source"] == "written"


def test_malformed_judge_reply_scores_zero_and_is_counted(url, example, tmp_path):
    Scripted.broken = {"judge-once"}                                      # R4's reply is garbage
    scores = _reward(url, tmp_path, regenerate_every=0).score(example, GROUP)
    assert scores[0]["judge_malformed"] == 1.0
    assert scores[3]["rubric"] == 0.0                                     # fail closed
    row = _log(tmp_path)[-1]
    assert row["rubrics"][0]["verdicts"] == [True, True, True, None]
    assert 'rollout 4: JudgeError: expected 3 verdicts, got ["maybe"]' in row["judge_errors"][0]
    Scripted.broken = {"judge"}                                           # every reply garbage
    scores = _reward(url, tmp_path, regenerate_every=0).score(example, GROUP)
    assert scores[0]["judge_malformed"] == 4.0 and all(s["fallback"] == 1.0 for s in scores)
    assert [s["rubric"] for s in scores] == [0.5] * 4                     # written: no rule checks


def test_malformed_writer_reply_falls_back_to_templates_and_is_counted(url, example, tmp_path):
    Scripted.broken = {"writer"}
    scores = _reward(url, tmp_path, regenerate_every=0).score(example, GROUP)
    assert scores[0]["writer_malformed"] == 1.0 and scores[0]["writer_fallback"] == 1.0
    row = _log(tmp_path)[-1]
    assert row["rubric_source"] == "writer_fallback" and row["source"] == "judged"
    assert row["rubrics"][0]["origin"] == "static"                        # the templated ones, judged
    assert not (tmp_path / "rubric_cache.jsonl").exists()                 # a failure is not cached


@pytest.mark.parametrize("reply, message", [
    ({"verdicts": ["yes"]}, "expected 2 verdicts"),
    ({"verdicts": ["yes", "perhaps"]}, "verdict 2 is 'perhaps'"),
    ({"verdicts": ["yes", 2]}, "verdict 2 is 2"),
    ({"verdicts": ["yes", "no"], "why": "x"}, "exactly the key 'verdicts'"),
    ({"scores": [1, 0]}, "exactly the key 'verdicts'"),
])
def test_verdicts_are_parsed_strictly(reply, message):
    with pytest.raises(JudgeError, match=message):
        parse_verdicts(reply, 2)
    assert parse_verdicts({"verdicts": ["Yes", 0, True, "false"]}, 4) == [True, False, True, False]


def test_a_negative_criterion_is_flipped_but_a_malformed_reply_earns_nothing():
    crit = [Rubric("a", "perception", "claims five [five]", weight=1.0, polarity=-1)]
    rubric, table = score_group(crit, [[True], [False], None], top_k=5)
    assert table[0]["satisfied"] == [0.0, 1.0, 0.0] and rubric == [0.0, 1.0, 0.0]


@pytest.fixture(scope="module")
def tiny_audio(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2-audio", tmp_path_factory.mktemp("tiny-hearer"))


def test_tiny_audio_model_as_writer_and_judge_fails_closed_and_counts(tiny_audio, example, tmp_path):
    """Random weights answer garbage: every writer and judge reply is malformed, each counted;
    the rubrics fall back to the templates, the judged scores to the static rule scores."""
    (tmp_path / "config.yaml").write_text(f"model:\n  path: {tiny_audio}\ntrain:\n  steps: 4\n")
    local = {"kind": "local", "model": str(tiny_audio), "device": "cpu", "max_new_tokens": 6}
    reward = AudioRubricsReward(writer=local, judge={"kind": "policy", "max_new_tokens": 6},
                                run_dir=str(tmp_path), log_path=str(tmp_path / "rubrics.jsonl"))
    assert reward.heard.hearer.state is reward.book.writer.hearer.state  # one copy of the weights
    assert reward.heard.name == f"policy:{tiny_audio.resolve()}" != reward.book.writer.name
    raw = reward.heard.hearer.generate([("s", "Reply with JSON.", list(example.audios))])
    assert isinstance(raw[0], str)                                        # the model heard and ran
    assert len(reward.heard.hearer.state) == 1 == len(reward.book.writer.hearer.state)
    second = Example(id="ex2", prompt=example.prompt, answer="B", choices=example.choices,
                     audios=example.audios)
    groups = reward.score_groups([example, second], [GROUP, GROUP], progress=0.25)
    assert all(s["writer_malformed"] == 2.0 and s["judge_malformed"] == 8.0
               for group in groups for s in group)
    assert all(s["fallback"] == 1.0 and s["writer_fallback"] == 1.0 for g in groups for s in g)
    rows = _log(tmp_path)
    assert [r["step"] for r in rows] == [1, 1] and {r["source"] for r in rows} == {"static_fallback"}
    # the static fallback is the rule judge on the templated rubrics: "three beep" states 3
    assert groups[0][0]["rubric"] > groups[0][3]["rubric"]
    assert not (tmp_path / "rubric_cache.jsonl").exists()
