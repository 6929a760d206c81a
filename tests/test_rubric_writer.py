"""The rubric writer: per-sample rubrics from a model (HTTP or local HF), strict parsing, the
templated fallback counted and logged, caching, and rubrics stored with the dataset."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from mmrlvr.data import Example, load_jsonl, write_jsonl
from mmrlvr.methods.audio_rubrics.reward import AudioRubricsReward
from mmrlvr.methods.audio_rubrics.checks import JudgeError
from mmrlvr.methods.audio_rubrics.writer import LLMWriter, RubricBook, Sample, parse_rubrics, write_rubrics, writer_prompt

EVIDENCE = {"duration_s": 2.0, "onset_count": 3, "onset_times_s": [0.2, 0.6, 1.0],
            "events": [{"start_s": 0.2, "end_s": 0.35, "duration_s": 0.15, "pitch_hz": 440.0,
                        "loudness_db": -12.0},
                       {"start_s": 0.6, "end_s": 0.75, "duration_s": 0.15, "pitch_hz": 440.0,
                        "loudness_db": -12.0},
                       {"start_s": 1.0, "end_s": 1.15, "duration_s": 0.15, "pitch_hz": 440.0,
                        "loudness_db": -12.0}],
            "loudness": {"mean_db": -20.0, "first_half_db": -18.0, "second_half_db": -19.0},
            "pitch": {"median_hz": 440.0}, "tempo": {"bpm": 150.0, "first_half_rate": 3.0,
                                                     "second_half_rate": 0.0},
            "spectral_centroid_hz": 450.0}
TEMPLATE = [{"id": "s1", "category": "perception", "criterion": "States 3 distinct sounds.",
             "weight": 1.0, "polarity": 1, "check": {"kind": "count", "value": 3}}]
GOOD = {"rubrics": [
    {"criterion": "States that the clip holds three beeps.", "category": "perception",
     "weight": 3, "polarity": "positive"},
    {"criterion": "Claims there are 5 beeps.", "category": "perception", "weight": 1,
     "polarity": "negative", "check": {"kind": "count", "value": 5}},
    {"criterion": "Notes the beeps are evenly spaced, 0.4 s apart.", "category": "reasoning",
     "weight": 1, "polarity": 1, "check": None}]}
GROUP = ["<think>I hear 3 beeps.</think><answer>C</answer>",
         "<think>I hear 5 beeps.</think><answer>D</answer>",
         "<think>Option 3 at 300 Hz.</think><answer>C</answer>",
         "<think>Three beeps.</think><answer>C</answer>"]


def _example(**meta):
    return Example(id="ex", prompt="How many beeps are in the clip?\nA. 1\nB. 2\nC. 3\nD. 5",
                   answer="C", choices=["1", "2", "3", "5"],
                   meta={"evidence": [EVIDENCE], "rubrics": TEMPLATE, **meta})


class _Writer(BaseHTTPRequestHandler):
    replies: ClassVar[list] = []
    seen: ClassVar[list] = []
    delay_s: ClassVar[float] = 0.0

    def do_POST(self):
        self.seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        time.sleep(self.delay_s)
        content = self.replies.pop(0) if self.replies else "not json"
        out = json.dumps({"choices": [{"message": {"content": content}}]}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
        except OSError:
            pass                                    # the client gave up (the timeout test)

    def log_message(self, *args):
        pass


@pytest.fixture()
def writer_url():
    _Writer.replies[:], _Writer.seen[:], _Writer.delay_s = [], [], 0.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Writer)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _reward(url, tmp_path, **writer):
    reward = AudioRubricsReward(log_path=str(tmp_path / "rubrics.jsonl"), max_proposals=0,
                                writer={"kind": "http", "url": url, "model": "writer",
                                        "timeout_s": 5, "retries": 0, **writer})
    reward.book.writer.backoff_s = 0.0
    return reward


def _log(tmp_path):
    return [json.loads(line) for line in (tmp_path / "rubrics.jsonl").read_text().splitlines()]


def test_http_writer_writes_rubrics_from_question_options_gold_and_evidence(writer_url, tmp_path):
    _Writer.replies[:] = ["Here you go:\n```json\n" + json.dumps(GOOD) + "\n```"]
    reward = _reward(writer_url, tmp_path, cache_path=str(tmp_path / "written.jsonl"))
    scores = reward.score(_example(), GROUP)
    prompt = _Writer.seen[0]["messages"][1]["content"]
    assert _Writer.seen[0]["model"] == "writer"
    assert "Question: How many beeps are in the clip?" in prompt and "D. 5" in prompt
    assert "Gold answer: C (3)" in prompt and "3 onsets" in prompt and "440 Hz" in prompt
    [row] = _log(tmp_path)
    assert row["rubric_source"] == "written" and row["writer"]["written"] == 1
    written = {r["id"]: r for r in row["rubrics"]}
    assert [r["origin"] for r in written.values()] == ["written"] * 3
    as_written = reward.rubrics_of(_example(), [EVIDENCE])[0]              # before reweighting
    assert [r.weight for r in as_written] == pytest.approx([0.6, 0.2, 0.2])
    assert written["w1"]["check"] == {"kind": "count", "value": 3}      # read off the criterion
    assert written["w3"]["check"] is None and not written["w3"]["kept"]  # rules cannot judge it
    # w1 [1,0,0,1] and flipped w2 [1,0,1,1] are kept, weighted by spread 0.5 : 0.433
    w1, w2 = 0.5 / (0.5 + 3 ** 0.5 / 4), (3 ** 0.5 / 4) / (0.5 + 3 ** 0.5 / 4)
    assert [s["rubric"] for s in scores] == pytest.approx([1.0, 0.0, w2, 1.0])
    assert written["w1"]["weight"] == pytest.approx(w1)
    assert [s["writer_fallback"] for s in scores] == [0.0] * 4
    reward.score(_example(), GROUP)                                      # cached for the run
    again = _reward(writer_url, tmp_path, cache_path=str(tmp_path / "written.jsonl"))
    again.score(_example(), GROUP)                                       # and across runs
    assert len(_Writer.seen) == 1 and again.book.counts == {"written": 0, "cached": 1, "fallback": 0}


@pytest.mark.parametrize("reply", [
    "I think there are three beeps.",                                  # no JSON at all
    '{"rubrics": [{"criterion": "x", "category": "perception", "weight": 1}',   # cut off
    json.dumps({"rubrics": []}),
    json.dumps({"rubric": GOOD["rubrics"]}),
])
def test_http_writer_malformed_reply_falls_back_to_templates_counted(writer_url, tmp_path, reply):
    _Writer.replies[:] = [reply]
    reward = _reward(writer_url, tmp_path)
    scores = reward.score(_example(), GROUP)
    [row] = _log(tmp_path)
    assert row["rubric_source"] == "writer_fallback" and row["writer"]["fallback"] == 1
    assert "rubric writer" in row["writer"]["error"]
    assert [r["id"] for r in row["rubrics"]] == ["s1"]                  # the templated rubric
    assert [s["writer_fallback"] for s in scores] == [1.0] * 4
    assert [s["rubric"] for s in scores] == [1.0, 0.0, 0.0, 1.0]       # "Option 3 at 300 Hz" is no count
    reward.score(_example(), GROUP)                                      # asked once per sample
    assert len(_Writer.seen) == 1 and reward.book.counts["fallback"] == 1


def test_http_writer_timeout_falls_back_and_retries_count(writer_url, tmp_path):
    _Writer.delay_s = 1.0
    _Writer.replies[:] = [json.dumps(GOOD)] * 2
    reward = _reward(writer_url, tmp_path, timeout_s=0.2, retries=1)
    scores = reward.score(_example(), GROUP)
    [row] = _log(tmp_path)
    assert row["rubric_source"] == "writer_fallback" and "after 2 tries" in row["writer"]["error"]
    assert "timed out" in row["writer"]["error"] and scores[0]["writer_fallback"] == 1.0
    assert len(_Writer.seen) == 2


@pytest.mark.parametrize("item, message", [
    ({"category": "perception", "weight": 1, "polarity": 1}, "missing"),
    ({"criterion": "x", "category": "perception", "weight": 1, "polarity": 1, "id": "a"}, "unexpected"),
    ({"criterion": " ", "category": "perception", "weight": 1, "polarity": 1}, "criterion"),
    ({"criterion": "x", "category": "vibes", "weight": 1, "polarity": 1}, "category"),
    ({"criterion": "x", "category": "style", "weight": 0, "polarity": 1}, "weight"),
    ({"criterion": "x", "category": "style", "weight": "1", "polarity": 1}, "weight"),
    ({"criterion": "x", "category": "style", "weight": float("nan"), "polarity": 1}, "weight"),
    ({"criterion": "x", "category": "style", "weight": 1, "polarity": "maybe"}, "polarity"),
    ({"criterion": "x", "category": "style", "weight": 1, "polarity": True}, "polarity"),
    ({"criterion": "x", "category": "style", "weight": 1, "polarity": 1,
      "check": {"kind": "count", "value": "3"}}, "whole number"),
    ({"criterion": "x", "category": "style", "weight": 1, "polarity": 1,
      "check": {"kind": "order", "attribute": "colour", "winner": "first"}}, "attribute"),
])
def test_parse_rubrics_rejects_any_other_shape(item, message):
    with pytest.raises(JudgeError, match=message):
        parse_rubrics({"rubrics": [item]}, 5)


def test_parse_rubrics_takes_at_most_max_rubrics_and_normalises():
    with pytest.raises(JudgeError, match="1 to 2 items"):
        parse_rubrics({"rubrics": [GOOD["rubrics"][0]] * 3}, 2)
    rows = parse_rubrics(GOOD, 3, [EVIDENCE])
    assert [r["polarity"] for r in rows] == [1, -1, 1] and sum(r["weight"] for r in rows) == 1.0


def test_a_check_the_evidence_refutes_is_dropped_not_rewarded():
    rows = parse_rubrics({"rubrics": [
        {"criterion": "States that there are 4 beeps.", "category": "perception", "weight": 1,
         "polarity": "positive"},                                        # the clip has 3
        {"criterion": "Says the second half is louder.", "category": "perception", "weight": 1,
         "polarity": "negative"},                                        # false: penalising it is right
        {"criterion": "x", "category": "perception", "weight": 1, "polarity": -1,
         "check": {"kind": "count", "value": 3}}]}, 5, [EVIDENCE])       # penalises the truth
    assert [r["check"] for r in rows] == [
        None, {"kind": "order", "attribute": "loudness", "winner": "second"}, None]


def test_gold_is_shown_unless_turned_off():
    sample = Sample("ex", "How many beeps?", ["1", "3"], "B", [EVIDENCE])
    assert "Gold answer: B (3)" in writer_prompt(sample, 5)
    assert "Gold answer" not in writer_prompt(sample, 5, show_gold=False)


def test_write_rubrics_stores_them_with_the_dataset_and_the_reward_uses_them(tmp_path):
    replies = iter([json.dumps(GOOD), "no"])
    writer = LLMWriter(lambda messages: next(replies), retries=0)
    examples = [_example(), Example(id="ex2", prompt="Q?", answer="A", choices=["x", "y"],
                                    meta={"evidence": [EVIDENCE]})]
    counts = write_rubrics(examples, writer)
    assert counts["written"] == 1 and counts["fallback"] == 1 and counts["errors"][0].startswith("ex2:")
    assert examples[0].meta["rubric_source"] == "written"
    assert [r["id"] for r in examples[0].meta["rubrics"]] == ["w1", "w2", "w3"]
    assert examples[1].meta["rubric_source"] == "template_fallback" and examples[1].meta["rubric_error"]
    assert examples[1].meta["rubrics"][0]["check"] == {"kind": "count", "value": 3}   # templated
    write_jsonl(examples, tmp_path / "rows.jsonl")
    stored = load_jsonl(tmp_path / "rows.jsonl")[0]
    reward = AudioRubricsReward(max_proposals=0, log_path=str(tmp_path / "rubrics.jsonl"))
    scores = reward.score(stored, GROUP)                                # no writer needed now
    assert _log(tmp_path)[0]["rubric_source"] == "stored_written" and "writer_fallback" not in scores[0]


def test_without_a_writer_nothing_changes(tmp_path):
    reward = AudioRubricsReward(max_proposals=0, log_path=str(tmp_path / "rubrics.jsonl"))
    assert reward.book is None
    scores = reward.score(_example(), GROUP)
    assert _log(tmp_path)[0]["rubric_source"] == "template" and "writer" not in _log(tmp_path)[0]
    assert set(scores[0]) == {"overall", "accuracy", "format", "rubric", "brevity", "rubrics_kept",
                              "fallback"}


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from mmrlvr.tiny import build_tiny

    return build_tiny("qwen2-audio", tmp_path_factory.mktemp("tiny-writer"))


def test_tiny_local_hf_writer_generates_garbage_and_falls_back_counted(tiny_lm, tmp_path):
    reward = AudioRubricsReward(max_proposals=0, log_path=str(tmp_path / "rubrics.jsonl"),
                                writer={"kind": "hf", "model": str(tiny_lm), "device": "cpu",
                                        "max_new_tokens": 12, "timeout_s": 30, "retries": 0})
    reply = reward.book.writer.hearer.complete([{"role": "user", "content": "Write rubrics."}])
    assert isinstance(reply, str) and reply                             # the model ran
    scores = reward.score(_example(), GROUP)
    [row] = _log(tmp_path)
    assert row["rubric_source"] == "writer_fallback" and "no JSON object" in row["writer"]["error"]
    assert row["writer"]["name"] == f"hf:{tiny_lm}" and reward.book.counts["fallback"] == 1
    assert [s["writer_fallback"] for s in scores] == [1.0] * 4


def test_writer_spec_errors_name_the_option():
    with pytest.raises(ValueError, match="writer kind http needs a 'url'"):
        AudioRubricsReward(writer={"kind": "http"})
    with pytest.raises(ValueError, match="unknown audio_rubrics writer kind 'bogus'"):
        AudioRubricsReward(writer={"kind": "bogus"})
    with pytest.raises(ValueError, match="'no/such/dir' is not rules, policy or a model dir"):
        AudioRubricsReward(writer="no/such/dir")
    with pytest.raises(ValueError, match="policy is the model.path of the run's config.yaml"):
        AudioRubricsReward(judge="policy")
    assert AudioRubricsReward(writer={"kind": "rules"}).book is None      # the templated path
    assert isinstance(RubricBook.from_spec({"kind": "hf", "model": "x"}).writer, LLMWriter)
