"""Tools (mmrlvr/tools), the tool-call format (mmrlvr/core/trajectory.py), the trajectory rewards
see (rewards/conventions.py, rewards/turns.py) and the multi-turn config checks: no model here."""
from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
from PIL import Image

import mmrlvr.tools as tools
import rewards
from mmrlvr.config import ConfigError, load_config
from mmrlvr.core.trajectory import (Completion, ToolCall, Trajectory, Turn, format_call,
                                    parse_call, trajectory_of)
from mmrlvr.data import Example
from mmrlvr.tools import Tool, ToolRunner
from mmrlvr.tools.builtin import CLIP_RATE, clip, zoom


def test_a_tool_call_parses_and_malformed_ones_say_why():
    assert parse_call("a " + format_call("zoom", x=1, y=2, w=3, h=4) + " junk") == \
        (ToolCall("zoom", {"x": 1, "y": 2, "w": 3, "h": 4}), "")
    assert parse_call('<tool_call>{"name": "f", "arguments": "{\\"t\\": 1}"}</tool_call>')[0] == \
        ToolCall("f", {"t": 1})
    assert parse_call("<answer>3</answer>") == (None, "")
    assert parse_call("<tool_call>{oops}</tool_call>")[1].startswith("the <tool_call> body is not JSON")
    assert "object" in parse_call('<tool_call>["zoom"]</tool_call>')[1]
    assert "arguments" in parse_call('<tool_call>{"name": "f", "arguments": 3}</tool_call>')[1]
    assert parse_call("<tool_call>{") == (None, "an unclosed <tool_call>")


def image_example(tmp_path, size=(40, 20)):
    img = Image.new("RGB", size, (255, 255, 255))
    img.putpixel((30, 5), (255, 0, 0))
    path = tmp_path / "img.png"
    img.save(path)
    return Example(id="s1", prompt="q", answer="1", images=[str(path)])


def test_zoom_crops_the_stored_image_and_refuses_an_empty_box(tmp_path):
    ex = image_example(tmp_path)
    crop = zoom(ex, x=28, y=3, w=10, h=100)                  # clamped to the image
    assert crop.size == (10, 17) and crop.getpixel((2, 2)) == (255, 0, 0)
    with pytest.raises(ValueError, match="holds no pixel"):
        zoom(ex, x=50, y=0, w=5, h=5)


def test_clip_cuts_the_stored_audio(tmp_path):
    import soundfile as sf

    wave = np.arange(CLIP_RATE * 2, dtype=np.float32) / (CLIP_RATE * 4)
    sf.write(tmp_path / "a.wav", wave, CLIP_RATE, subtype="FLOAT")
    ex = Example(id="a1", prompt="q", answer="x", audios=[str(tmp_path / "a.wav")])
    cut, sr = clip(ex, t0=0.5, t1=1.0)
    assert sr == CLIP_RATE and len(cut) == CLIP_RATE // 2
    assert cut[0] == pytest.approx(wave[CLIP_RATE // 2])
    with pytest.raises(ValueError, match="under 10 ms"):
        clip(ex, t0=3, t1=4)


def test_every_failing_call_is_a_counted_error_message_and_a_hang_is_cut(tmp_path):
    def raises(example, x):
        raise KeyError("nope")

    def hangs(example, x):
        time.sleep(120)

    def bad(example, x):
        return {"tiny": Image.new("RGB", (1, 1)), "huge": Image.new("1", (9000, 2)),
                "object": object(), "nan": (np.array([np.nan]), 16000), "both": {
                    "image": Image.new("RGB", (2, 2)), "audio": (np.zeros(4), 8000)}}[x]

    runner = ToolRunner([Tool("raises", raises, 5), Tool("hangs", hangs, 0.5),
                         Tool("bad", bad, 5, {}), Tool("ok", lambda example, x: f"got {x}", 5)])
    ex = Example(id="e", prompt="q", answer="a")
    calls = [ToolCall("raises", {"x": 1}), ToolCall("hangs", {"x": 1}),
             ToolCall("bad", {"x": "huge"}), ToolCall("bad", {"x": "object"}),
             ToolCall("bad", {"x": "nan"}), ToolCall("bad", {"x": "both"}),
             ToolCall("nope", {}), ToolCall("ok", {"y": 1}), ToolCall("ok", {"x": 2}),
             ToolCall("bad", {"x": "tiny"})]
    t0 = time.perf_counter()
    out = runner.run_all([(ex, c) for c in calls])
    assert time.perf_counter() - t0 < 60                       # the 120 s hang did not hold it
    kinds = [r.error.partition(":")[0] if r.kind == "error" else r.kind for r in out]
    assert kinds == ["raised", "timeout", "bad_result", "bad_result", "bad_result", "bad_result",
                     "unknown_tool", "bad_args", "text", "image"]
    assert "KeyError: 'nope'" in out[0].error and out[8].text == "got 2"
    counts = runner.take_counts()
    assert counts["calls"] == 10 and counts["errors_bad_result"] == 4
    assert counts["errors_timeout"] == counts["errors_raised"] == counts["errors_unknown_tool"] == 1
    assert runner.take_counts() == {}


def test_a_user_tool_loads_from_a_file_and_options_are_its_own(tmp_path):
    (tmp_path / "mine.py").write_text("def lookup(example, key, table=None):\n"
                                      "    return str(table[key])\n")
    runner = tools.build_runner([{"name": f"{tmp_path / 'mine.py'}:lookup",
                                  "table": {"a": 7}, "timeout_s": 2}])
    ex = Example(id="e", prompt="q", answer="a")
    ok, clash = runner.run_all([(ex, ToolCall("lookup", {"key": "a"})),
                                (ex, ToolCall("lookup", {"key": "a", "table": {}}))])
    assert ok.text == "7" and clash.error.startswith("bad_args: lookup sets ['table'] itself")
    with pytest.raises(ConfigError, match="not found"):
        tools.get(f"{tmp_path / 'missing.py'}:f")


def trajectory(final: str, call_ok: bool = True, tool_error: str = "") -> Completion:
    first = Turn(format_call("zoom", x=0, y=0, w=1, h=1), ToolCall("zoom", {}) if call_ok else None,
                 "" if call_ok else "the <tool_call> body is not JSON", "image", "", tool_error)
    return Completion(final, Trajectory([first, Turn(final)]))


def test_rewards_see_the_trajectory_and_old_ones_the_final_answer(tmp_path):
    ex = Example(id="e", prompt="q", answer="3")
    good = trajectory("<think>two and one</think><answer>3</answer>")
    assert rewards.get("accuracy").score(ex, [good])[0]["overall"] == 1.0    # the final turn
    (tmp_path / "r.py").write_text(
        "def native(example, completion, trajectory=None):\n"
        "    return float(len(trajectory.turns)) if trajectory else -1.0\n"
        "def plain(example, completion):\n    return float(completion == 'x')\n"
        "def trl(prompts, completions, trajectories=None, **kw):\n"
        "    return [len(t.calls) if t else -1 for t in trajectories or [None] * len(completions)]\n")
    native, plain, trl = (rewards.get(f"{tmp_path / 'r.py'}:{f}") for f in ("native", "plain", "trl"))
    groups = [[good, "x"]]
    assert [s["overall"] for s in native.score_groups([ex], groups)[0]] == [2.0, -1.0]
    assert [s["overall"] for s in plain.score_groups([ex], groups)[0]] == [0.0, 1.0]
    assert [s["overall"] for s in trl.score_groups([ex], groups)[0]] == [1.0, -1.0]
    assert [s["overall"] for s in trl.score_groups([ex], [["x", "y"]])[0]] == [-1.0, -1.0]
    again = pickle.loads(pickle.dumps(good))                # process-isolated rewards get it too
    assert again == good and trajectory_of(again).turns[0].call.name == "zoom"


def test_the_turn_format_reward_scores_each_turn():
    reward = rewards.get("turn_format")
    ex = Example(id="e", prompt="q", answer="3")
    answer = "<think>t</think><answer>3</answer>"
    scores = reward.score(ex, [trajectory(answer), trajectory("no tags"),
                               trajectory(answer, call_ok=False), answer, "bare"])
    assert [s["overall"] for s in scores] == [1.0, 0.5, 0.5, 1.0, 0.0]
    assert scores[0]["calls"] == 1.0 and scores[0]["turns"] == 2.0 and scores[3]["turns"] == 1.0
    strict = rewards.get("turn_format", error_counts=False)
    assert strict.score(ex, [trajectory(answer, tool_error="raised: x")])[0]["overall"] == 0.5
    stopped = Completion("c", Trajectory([Turn("c", ToolCall("zoom", {}))], "max_turns"))
    assert reward.score(ex, [stopped])[0]["overall"] == 0.0


def test_multi_turn_keys_are_checked_with_the_config():
    ok = load_config(None, ["rollout.max_turns=3", "rollout.tools=[{name: zoom}]"])
    assert ok.rollout.max_turns == 3
    for overrides, says in [
            (["rollout.tools=[{name: zoom}]"], "a tool's result needs a turn after it"),
            (["rollout.max_turns=3"], "rollout.tools is empty"),
            (["rollout.max_turns=0"], "must be an integer >= 1"),
            (["rollout.max_turns=2", "rollout.tools=[{name: zoom}, {name: zoom}]"], "twice"),
            (["rollout.max_turns=2", "rollout.tools=[{name: zoom, timeout_s: 0}]"], "timeout_s"),
            (["rollout.max_turns=2", "rollout.tools=[zoom]"], "list of {name, ...} mappings"),
            (["rollout.max_turns=2", "rollout.tools=[{name: zoom}]", "rollout.backend=vllm"],
             "hf engine only"),
            (["rollout.max_turns=2", "rollout.tools=[{name: zoom}]", "train.packing=true"],
             "packing")]:
        with pytest.raises(ConfigError, match=says):
            load_config(None, overrides)
