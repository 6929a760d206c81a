"""A user's reward cannot crash, hang or poison a run: each call has a timeout, and exceptions,
wrong return types and non-finite values score the failure value and are counted."""
from __future__ import annotations

import json
import math
import os
import signal
import textwrap
import threading
import time

import pytest

import rewards
from mmrlvr.data import Example
from rewards.base import FAILURE_KINDS, Isolated, RewardError, build_combined

EX = Example(id="q7", prompt="What is 2 + 3?", answer="5")
OK = {"failed": 0.0, **{f"failed_{kind}": 0.0 for kind in FAILURE_KINDS}}


def failed(kind: str) -> dict[str, float]:
    return {"failed": 1.0, **{f"failed_{k}": float(k == kind) for k in FAILURE_KINDS}}


def user_reward(tmp_path, source: str, fn: str, **spec):
    """`build_combined` over `fn` of a reward file in tmp_path; errors go to errors.jsonl."""
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(source))
    return build_combined([{"name": f"{path}:{fn}", "weight": 1.0, **spec}],
                          error_log=tmp_path / "errors.jsonl")


def log_lines(tmp_path) -> list[dict]:
    path = tmp_path / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def parts(row: dict, name: str) -> dict[str, float]:
    """The reward's own dict back out of a combined row: `overall` and its `name/...` keys."""
    out = {"overall": row[name]}
    out.update({k.split("/", 1)[1]: v for k, v in row.items() if k.startswith(f"{name}/")})
    return out


SOURCE = """
    import math

    def fragile(example, text, bonus=0.0):
        if text == "nan":
            return math.nan
        if text == "inf":
            return math.inf
        if text == "-inf":
            return {"overall": 1.0, "part": -math.inf}
        if text == "raise":
            return {"a": 1}["missing_key"]
        if text == "str":
            return "1.0"
        if text == "none":
            return None
        if text == "no overall":
            return {"score": 1.0}
        if text == "word part":
            return {"overall": 1.0, "part": "high"}
        if text == "list":
            return [1.0]
        if text == "bool":
            return True
        return {"overall": float(text == "5") + bonus, "part": 0.5}
"""


def test_bad_values_score_the_failure_value_and_are_counted_per_kind(tmp_path):
    combined = user_reward(tmp_path, SOURCE, "fragile", bonus=0.25, failure_value=-1.0)
    texts = ["5", "nan", "inf", "-inf", "raise", "str", "none", "no overall", "word part", "list",
             "bool", "4"]
    rows = combined.score(EX, texts)
    kinds = ["ok", "nonfinite", "nonfinite", "nonfinite", "error", "type", "type", "type", "type",
             "type", "ok", "ok"]
    for text, row, kind in zip(texts, rows, kinds):
        expected_flags = OK if kind == "ok" else failed(kind)
        assert {k: v for k, v in parts(row, "fragile").items() if k.startswith("failed")} \
            == expected_flags, text
        assert all(math.isfinite(v) for v in row.values()), text
    assert parts(rows[0], "fragile") == {"overall": 1.25, "part": 0.5, **OK}   # options reach fn
    assert parts(rows[-1], "fragile") == {"overall": 0.25, "part": 0.5, **OK}
    assert parts(rows[-2], "fragile") == {"overall": 1.0, "part": 0.0, **OK}   # bool: a number
    # a failure scores failure_value; components the reward has shown before read 0 (same keys)
    assert parts(rows[1], "fragile") == {"overall": -1.0, "part": 0.0, **failed("nonfinite")}
    assert rows[1]["overall"] == -1.0
    assert len({frozenset(row) for row in rows}) == 1                          # one key set


def test_failures_go_to_the_error_log_with_example_index_and_traceback(tmp_path):
    combined = user_reward(tmp_path, SOURCE, "fragile")
    combined.score(EX, ["5", "raise", "str", "nan", "no overall"])
    lines = log_lines(tmp_path)
    assert [(r["reward"], r["kind"], r["example"], r["completion"]) for r in lines] == [
        ("fragile", "error", "q7", 1), ("fragile", "type", "q7", 2),
        ("fragile", "nonfinite", "q7", 3), ("fragile", "type", "q7", 4)]
    error = lines[0]["detail"]
    assert "KeyError: 'missing_key'" in error and "my_reward.py" in error
    assert 'return {"a": 1}["missing_key"]' in error
    assert not any(f"rewards/{module}.py" in error                # the user's frames, not ours
                   for module in ("base", "isolation", "conventions", "workers"))
    assert "'1.0'" in lines[1]["detail"] and "not a number" in lines[1]["detail"]
    assert "nan" in lines[2]["detail"] and "without 'overall'" in lines[3]["detail"]
    assert lines[0]["text"] == "raise" and lines[0]["time"][:2] == "20"


def test_the_error_log_keeps_only_the_first_failures_of_each_reward(tmp_path):
    combined = user_reward(tmp_path, SOURCE, "fragile")
    rows = combined.score(EX, ["raise"] * 25)
    assert len(log_lines(tmp_path)) == 20
    assert all(row["fragile/failed"] == 1.0 for row in rows)                 # all still counted


def test_a_reward_failing_on_every_completion_of_the_step_is_named_with_its_traceback(tmp_path):
    combined = user_reward(tmp_path, SOURCE, "fragile")
    some = [combined.score(EX, ["5", "nan"]), combined.score(EX, ["raise", "4"])]
    assert combined.all_failed(some) is None
    every = [combined.score(EX, ["raise", "nan"]), combined.score(EX, ["str", "inf"])]
    message = combined.all_failed(every)
    assert message.startswith("reward fragile failed on every one of the 4 completions")
    assert "(1 error, 1 type, 2 nonfinite)" in message
    assert "KeyError: 'missing_key'" in message and "example 'q7', completion 0" in message
    with pytest.raises(RewardError, match="fragile"):
        raise RewardError(message)                            # what the trainer does with it


def test_the_all_failed_message_hints_at_main_thread_only_code(tmp_path):
    combined = user_reward(tmp_path, """
        import signal

        def alarm(example, text):
            signal.signal(signal.SIGALRM, signal.SIG_DFL)   # what signal-based timeouts do
            return 1.0
    """, "alarm")
    message = combined.all_failed([combined.score(EX, ["a", "b"])])
    assert "main thread" in message and "parsing_timeout=None" in message


def test_a_hanging_function_times_out_per_completion_and_the_run_goes_on(tmp_path):
    combined = user_reward(tmp_path, """
        import time

        def slow(example, text):
            if text == "hang":
                time.sleep(3600)
            return 1.0
    """, "slow", timeout_s=0.3)
    start = time.perf_counter()
    rows = combined.score(EX, ["ok", "hang", "ok"])
    assert time.perf_counter() - start < 60       # not the hour the hung call sleeps
    assert [row["slow"] for row in rows] == [1.0, 0.0, 1.0]
    assert [row["slow/failed_timeout"] for row in rows] == [0.0, 1.0, 0.0]
    [line] = log_lines(tmp_path)
    assert line["kind"] == "timeout" and line["completion"] == 1
    assert "time.sleep(3600)" in line["detail"] and "timeout_s=0.3" in line["detail"]
    hung = [t for t in threading.enumerate() if t.name == "reward slow" and t.is_alive()]
    assert hung and all(t.daemon for t in hung)               # never holds up the exit


def test_a_function_that_keeps_hanging_stops_the_run_with_a_reward_error(tmp_path):
    combined = user_reward(tmp_path, """
        import threading

        def stuck(example, text):
            threading.Event().wait()
    """, "stuck", timeout_s=0.2)
    combined.parts[0][2].max_hung = 3
    assert combined.score(EX, ["a", "b"])[1]["stuck/failed_timeout"] == 1.0
    with pytest.raises(RewardError, match=r"reward stuck hangs: 3 of its calls .*timeout_s=0.2") \
            as error:
        combined.score(EX, ["c", "d"])
    assert "threading.Event().wait()" in str(error.value)             # where it hangs


def test_a_call_that_finishes_late_is_no_longer_outstanding(tmp_path):
    combined = user_reward(tmp_path, """
        import time

        def late(example, text):
            time.sleep(0.3)
            return 1.0
    """, "late", timeout_s=0.05)
    reward = combined.parts[0][2]
    reward.max_hung = 2
    assert combined.score(EX, ["a"])[0]["late/failed_timeout"] == 1.0
    assert reward.hung == 1
    deadline = time.monotonic() + 60              # a wait, not a bound: it returns in 0.3 s
    while reward.hung and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reward.hung == 0                                   # it returned, late
    assert combined.score(EX, ["b"])[0]["late/failed_timeout"] == 1.0     # 1 outstanding, not 2
    reward.timeout_s = 2.0
    assert combined.score(EX, ["c"])[0] == {"overall": 1.0, "late": 1.0,
                                             **{f"late/{k}": v for k, v in OK.items()}}


GROUP_SOURCE = """
    import math
    import time

    class Judge:
        def __init__(self, mode="ok"):
            self.name, self.mode, self.progress = "judge", mode, None

        def score(self, example, completions, progress=0.0):
            self.progress = progress
            if self.mode == "hang":
                time.sleep(3600)
            if self.mode == "raise":
                raise RuntimeError("judge server unreachable")
            if self.mode == "short":
                return [{"overall": 1.0}]
            if self.mode == "none":
                return None
            return [{"overall": math.nan if t == "nan" else 1.0, "agree": 1.0} for t in completions]
"""


def test_a_group_reward_that_hangs_fails_its_whole_group_once(tmp_path):
    combined = user_reward(tmp_path, GROUP_SOURCE, "Judge", mode="hang", timeout_s=0.3)
    start = time.perf_counter()
    rows = combined.score(EX, ["a", "b", "c", "d"])
    assert time.perf_counter() - start < 60                   # not the hour the call sleeps
    assert all(parts(row, "Judge") == {"overall": 0.0, **failed("timeout")} for row in rows)
    [line] = log_lines(tmp_path)                 # one timeout for the group, not one per completion
    assert line["completion"] is None and line["text"] is None and "time.sleep" in line["detail"]
    assert "the whole group" in combined.all_failed([rows])


@pytest.mark.parametrize("mode,kind,detail", [
    ("raise", "error", "RuntimeError: judge server unreachable"),
    ("short", "type", "returned 1 results for 3 completions"),
    ("none", "type", "returned None for 3 completions"),
])
def test_a_group_reward_that_breaks_fails_its_group(tmp_path, mode, kind, detail):
    combined = user_reward(tmp_path, GROUP_SOURCE, "Judge", mode=mode)
    rows = combined.score(EX, ["a", "b", "c"])
    assert all(parts(row, "Judge") == {"overall": 0.0, **failed(kind)} for row in rows)
    [line] = log_lines(tmp_path)
    assert detail in line["detail"] and line["kind"] == kind


def test_a_group_reward_with_one_nan_fails_only_that_completion(tmp_path):
    combined = user_reward(tmp_path, GROUP_SOURCE, "Judge")
    rows = combined.score(EX, ["a", "nan", "b"], progress=0.5)
    assert combined.parts[0][2].reward.progress == 0.5        # progress reaches the reward
    assert [parts(row, "Judge") for row in rows] == [
        {"overall": 1.0, "agree": 1.0, **OK}, {"overall": 0.0, "agree": 0.0, **failed("nonfinite")},
        {"overall": 1.0, "agree": 1.0, **OK}]
    assert [line["completion"] for line in log_lines(tmp_path)] == [1]


def test_built_in_rewards_run_inline_and_score_exactly_as_before(tmp_path):
    texts = ["<think>2 and 3</think><answer>5</answer>", "<answer>4</answer>", "5", "",
             "<think>x</think><answer>\\frac{10}{2}</answer>"]
    specs = [{"name": "accuracy", "weight": 0.9}, {"name": "format", "weight": 0.1}]
    combined = build_combined(specs, error_log=tmp_path / "errors.jsonl")
    acc = rewards.get("accuracy").score(EX, texts)
    fmt = rewards.get("format").score(EX, texts)
    expected = []
    for a, f in zip(acc, fmt):
        row = {"overall": 0.0 + 0.9 * a["overall"] + 0.1 * f["overall"], "accuracy": a["overall"]}
        row.update({f"accuracy/{k}": v for k, v in a.items() if k != "overall"})
        row["format"] = f["overall"]
        row.update({f"format/{k}": v for k, v in f.items() if k != "overall"})
        expected.append(row)
    rows = combined.score(EX, texts)
    assert rows == expected and [list(r) for r in rows] == [list(r) for r in expected]
    assert not any(isinstance(reward, Isolated) for _, _, reward in combined.parts)
    assert not (tmp_path / "errors.jsonl").exists()


def test_a_built_in_reward_is_isolated_only_when_its_spec_asks(tmp_path):
    plain = build_combined([{"name": "accuracy"}]).score(EX, ["<answer>5</answer>", "6"])
    isolated = build_combined([{"name": "accuracy", "timeout_s": 5}]).score(
        EX, ["<answer>5</answer>", "6"])
    assert [{k: v for k, v in row.items() if "failed" not in k} for row in isolated] == plain
    assert all(row["accuracy/failed"] == 0.0 for row in isolated)


@pytest.mark.parametrize("spec,message", [
    ({"timeout_s": 0}, "timeout_s must be a positive number"),
    ({"timeout_s": "5"}, "timeout_s must be a positive number"),
    ({"failure_value": math.nan}, "failure_value must be a finite number"),
    ({"isolation": "fork"}, "isolation must be 'thread' or 'process'"),
    ({"memory_mb": 64}, "memory_mb caps a worker process; it needs isolation: process"),
    ({"isolation": "process", "memory_mb": 0}, "memory_mb must be a positive number of MB"),
])
def test_bad_isolation_options_fail_when_the_rewards_are_built(tmp_path, spec, message):
    with pytest.raises(ValueError, match=message):
        user_reward(tmp_path, SOURCE, "fragile", **spec)


def test_a_score_beyond_float32_is_a_counted_failure_not_a_silent_zero(tmp_path):
    """1e308 is a finite float but inf as the float32 the rewards become: a failure, counted."""
    reward = user_reward(tmp_path, "def huge(example, text):\n"
                                   "    return 1e308 if text == 'x' else 0.5\n", "huge")
    rows = reward.score(EX, ["x", "y"])
    assert [r["overall"] for r in rows] == [0.0, 0.5]
    name = next(k for k in rows[0] if k.endswith("/failed_nonfinite"))
    assert [r[name] for r in rows] == [1.0, 0.0]
    assert "outside float32's range" in log_lines(tmp_path)[0]["detail"]


def test_a_reward_that_edits_its_inputs_changes_nothing_the_run_reads(tmp_path):
    """A native reward that rewrites `example.answer` and a TRL one that empties its `images`
    column: the example (the run's data) and every other call see the originals."""
    native = user_reward(tmp_path, """
        def edits(example, text):
            seen = example.answer
            example.answer = "changed"
            example.images.clear()
            return float(seen == "5")
        """, "edits")
    ex = Example(id="q", prompt="What is 2 + 3?", answer="5", images=["a.png"])
    assert [r["overall"] for r in native.score(ex, ["a", "b", "c"])] == [1.0, 1.0, 1.0]
    assert ex.answer == "5" and ex.images == ["a.png"]
    (tmp_path / "trl.py").write_text(
        "def trl_edits(completions, images, solution, **kw):\n"
        "    out = [float(len(images[0]) == 1 and s == '5') for s in solution]\n"
        "    images[0].clear()\n    solution[0] = 'changed'\n    return out\n")
    trl = build_combined([{"name": f"{tmp_path / 'trl.py'}:trl_edits", "weight": 1.0}])
    for _ in range(2):                                  # the second step sees the originals too
        assert [r["overall"] for r in trl.score(ex, ["a", "b"])] == [1.0, 1.0]
    assert ex.answer == "5" and ex.images == ["a.png"]


EXITS = """
    import sys

    {kw}def exits(example, text):
        if text == "exit":
            sys.exit(3)
        if text == "ctrl-c":
            raise KeyboardInterrupt
        if text == "memory":
            raise MemoryError
        return 1.0
"""


@pytest.mark.parametrize("kw", ["", "async "])
def test_system_exit_ctrl_c_and_memory_error_inside_a_reward_are_counted_errors(tmp_path, kw):
    """Raised inside the reward they are its failures; the run, and an async reward's event
    loop (asyncio re-raises SystemExit out of the loop, which then never answered again), go on."""
    combined = user_reward(tmp_path, EXITS.format(kw=kw), "exits", timeout_s=5)
    for _ in range(2):
        rows = combined.score(EX, ["exit", "ctrl-c", "memory", "ok"])
        assert [parts(row, "exits") for row in rows] == [
            {"overall": 0.0, **failed("error")}] * 3 + [{"overall": 1.0, **OK}]
    assert [line["detail"].strip().splitlines()[-1] for line in log_lines(tmp_path)[:3]] == [
        "SystemExit: 3", "KeyboardInterrupt", "MemoryError"]


SLOW = """
    import asyncio, time

    def slow(example, text):
        time.sleep(60 if text == "hang" else 0.6)
        return 1.0

    async def aslow(example, text):
        await asyncio.sleep(60 if text == "hang" else 0.6)
        return 1.0
"""


@pytest.mark.parametrize("fn", ["slow", "aslow"])
def test_a_real_ctrl_c_while_a_reward_runs_reaches_the_trainer(tmp_path, fn):
    """The trainer's Ctrl-C is not the reward's: under the preemption handler the step's scores
    come back whole and the handler has the signal; with Python's default handler the
    KeyboardInterrupt leaves `score` at once instead of becoming a counted reward error."""
    from mmrlvr.train.preempt import Preemption

    combined = user_reward(tmp_path, SLOW, fn, timeout_s=5)
    ctrl_c = lambda: threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGINT)).start()
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Preemption() as preemption:
            ctrl_c()
            rows = combined.score(EX, ["a", "b"])
        assert preemption.signal == "SIGINT"
        assert [parts(row, fn) for row in rows] == [{"overall": 1.0, **OK}] * 2
        ctrl_c()
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            combined.score(EX, ["hang", "hang"])
        assert time.monotonic() - start < 30       # at once, not after the calls' 60 s sleeps
    finally:
        signal.signal(signal.SIGINT, before)
    assert not log_lines(tmp_path)                 # no reward failure was counted


RISKY = """
    import ctypes, os, time

    def risky(example, text):
        if text == "exit":
            os._exit(3)
        if text == "segfault":
            ctypes.string_at(0)
        if text == "hang":
            time.sleep(3600)
        if text == "slow":
            time.sleep(0.6)
        if text == "leak":
            return len(bytearray(400 << 20))
        if text == "edit":
            example.answer = "changed"
            return 0.0
        return float(example.answer == "5")
"""


def test_a_reward_in_its_own_process_survives_exit_segfault_hang_and_leak(tmp_path):
    """`isolation: process`: what would kill the trainer (os._exit, a segfault) or leave a thread
    running forever (a hang) or grow it (a 400 MB allocation against memory_mb 64) costs that
    call, counted with the cause, and a new worker; the call after it scores normally."""
    from mmrlvr.train.preempt import Preemption

    combined = user_reward(tmp_path, RISKY, "risky", timeout_s=2, isolation="process",
                           memory_mb=64)
    reward = combined.parts[0][2]
    ex = Example(id="q7", prompt="What is 2 + 3?", answer="5", images=["a.png"])
    assert [r["overall"] for r in combined.score(ex, ["edit", "ok"])] == [0.0, 1.0]
    assert ex.answer == "5" and ex.images == ["a.png"]
    for text, kind in [("exit", "error"), ("segfault", "error"), ("hang", "timeout"),
                       ("leak", "error")]:
        rows = combined.score(ex, [text, "ok"])
        assert [parts(row, "risky") for row in rows] == [
            {"overall": 0.0, **failed(kind)}, {"overall": 1.0, **OK}], text
    details = [line["detail"] for line in log_lines(tmp_path)]
    assert "process died during the call (exit code 3)" in details[0]
    assert "killed by SIGSEGV" in details[1]
    assert 'my_reward.py", line 10 in risky' in details[2] and "was killed" in details[2]
    assert "MemoryError" in details[3] and "memory_mb=64" in details[3]
    assert reward.worker.starts == 5 and reward.hung == 0      # four restarts, nothing left hung
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:                                # a Ctrl-C mid-call reaches the trainer, not the worker
        with Preemption() as preemption:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
            rows = combined.score(ex, ["slow", "ok"])
    finally:
        signal.signal(signal.SIGINT, before)
    assert preemption.signal == "SIGINT"
    assert [parts(row, "risky") for row in rows] == [{"overall": 1.0, **OK}] * 2
    assert reward.worker.starts == 5                            # the worker ignored it
    zygote = reward.worker._zygote
    reward.worker.close()
    assert zygote.poll() is not None                            # nothing left running


def test_isolation_options_are_checked_before_anything_loads():
    from mmrlvr.config import Config, find_problems

    cfg = Config()
    cfg.rewards = [{"name": "accuracy", "isolation": "fork"},
                   {"name": "accuracy", "memory_mb": 100},
                   {"name": "accuracy", "isolation": "process", "memory_mb": -1},
                   {"name": "accuracy", "isolation": "process", "memory_mb": 512}]
    problems = "\n".join(find_problems(cfg))
    assert "'rewards[0].isolation' must be 'thread' (the default) or 'process'" in problems
    assert "'rewards[1].memory_mb' must be a positive number of MB with isolation: process" \
        in problems
    assert "'rewards[2].memory_mb'" in problems and "rewards[3]" not in problems
