"""A reward written for TRL, EasyR1 or ms-swift loads unchanged from `file.py:name`: its
signature (or `style:`) says how to call it, it scores exactly what its native twin scores, and
it stays isolated (timeouts, failures counted) like any user reward."""
from __future__ import annotations

import json
import textwrap
import time

import pytest

import rewards
from mmrlvr.data import Example
from rewards.base import FAILURE_KINDS, build_combined
from rewards.conventions import SIGNATURES, ConventionError

EXAMPLES = [Example(id="q1", prompt="What is 2 + 3?", answer="5", meta={"level": "easy"}),
            Example(id="q2", prompt="What is 6 * 7?", answer="42", meta={"level": "medium"}),
            Example(id="q3", prompt="Area of a 3 by 4 rectangle?", answer="12",
                    images=["rect.png"], meta={"level": "hard", "unit": "cm2"})]
GROUPS = [["<think>2 + 3</think><answer>5</answer>", "<answer>6</answer>",
           "<think>add</think> so \\boxed{5}", "no idea"],
          ["<think>6 * 7 = 42</think> \\boxed{42}", "<answer> 42 </answer>",
           "<think>x</think><answer>41</answer>", ""],
          ["<think>3 * 4</think>\\boxed{12}", "\\boxed{12}", "<answer>12</answer>",
           "<think>7</think><answer>7</answer>"]]

NATIVE = """
    import re

    def answer_tag(example, completion):
        match = re.search(r"<answer>(.*?)</answer>", completion, re.DOTALL)
        return float(match is not None and match.group(1).strip() == example.answer)

    def boxed_math(example, completion, format_weight=0.1):
        response = re.sub(r"\\s*(<|>|/)\\s*", r"\\1", completion)
        fmt = 1.0 if re.fullmatch(r"<think>.*</think>.*\\\\boxed\\{.*\\}.*", response, re.DOTALL) else 0.0
        match = re.search(r"\\\\boxed\\{([^}]*)\\}", response)
        acc = 1.0 if match and match.group(1).strip() == example.answer else 0.0
        return {"overall": (1 - format_weight) * acc + format_weight * fmt, "format": fmt,
                "accuracy": acc}
"""

TRL = """
    import re

    def accuracy_reward(completions, solution, **kwargs):
        \"\"\"1.0 when the <answer> tag holds the `solution` column.\"\"\"
        pattern = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
        rewards = []
        for content, sol in zip(completions, solution):
            match = pattern.search(content)
            rewards.append(1.0 if match and match.group(1).strip() == sol.strip() else 0.0)
        return rewards
"""

EASYR1 = """
    import re
    from typing import Any

    def format_reward(response: str) -> float:
        pattern = re.compile(r"<think>.*</think>.*\\\\boxed\\{.*\\}.*", re.DOTALL)
        return 1.0 if re.fullmatch(pattern, response) else 0.0

    def accuracy_reward(response: str, ground_truth: str) -> float:
        match = re.search(r"\\\\boxed\\{([^}]*)\\}", response)
        return 1.0 if match and match.group(1).strip() == ground_truth.strip() else 0.0

    def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1) -> list[dict[str, float]]:
        if not isinstance(reward_inputs, list):
            raise ValueError("Please use `reward_type=batch` for math reward function.")
        scores = []
        for reward_input in reward_inputs:
            response = re.sub(r"\\s*(<|>|/)\\s*", r"\\1", reward_input["response"])
            format_score = format_reward(response)
            accuracy_score = accuracy_reward(response, reward_input["ground_truth"])
            scores.append({
                "overall": (1 - format_weight) * accuracy_score + format_weight * format_score,
                "format": format_score,
                "accuracy": accuracy_score,
            })
        return scores

    def compute_score_sequential(reward_input: dict[str, Any], format_weight: float = 0.1) -> dict[str, float]:
        return compute_score([reward_input], format_weight)[0]
"""

SWIFT = """
    import re
    from typing import List

    class ORM:  # in ms-swift: from swift.plugin import ORM
        def __call__(self, **kwargs) -> List[float]:
            raise NotImplementedError

    class AnswerAccuracy(ORM):

        def __call__(self, completions, solution, **kwargs) -> List[float]:
            rewards = []
            for content, sol in zip(completions, solution):
                match = re.search(r"<answer>(.*?)</answer>", content, re.DOTALL)
                rewards.append(float(match is not None and match.group(1).strip() == sol))
            return rewards

    orms = {"external_answer_acc": AnswerAccuracy}  # in ms-swift: swift.plugin.orms
"""

ASYNC_TRL = """
    import asyncio
    import re

    async def judge_reward(prompts, completions, completion_ids=None, **kwargs):
        \"\"\"Asks a (here simulated) remote judge about every completion at once.\"\"\"
        async def ask(completion, solution):
            await asyncio.sleep(0.05)                     # the judge's latency
            match = re.search(r"<answer>(.*?)</answer>", completion, re.DOTALL)
            return 1.0 if match and match.group(1).strip() == solution else 0.0
        return await asyncio.gather(*(ask(c, s) for c, s in zip(completions, kwargs["solution"])))
"""


def write(tmp_path, source: str, file: str = "my_reward.py"):
    path = tmp_path / file
    path.write_text(textwrap.dedent(source))
    return path


def combined(tmp_path, source: str, fn: str, **spec):
    path = write(tmp_path, source)
    return build_combined([{"name": f"{path}:{fn}", "weight": 1.0, **spec}],
                          error_log=tmp_path / "errors.jsonl")


def own(row: dict, name: str) -> dict[str, float]:
    """The reward's own scores from a combined row, without the isolation flags."""
    out = {"overall": row[name]}
    out.update({k.split("/", 1)[1]: v for k, v in row.items() if k.startswith(f"{name}/")})
    return {k: v for k, v in out.items() if not k.startswith("failed") and k != "skipped"}


def log_lines(tmp_path) -> list[dict]:
    path = tmp_path / "errors.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("source,fn,style,twin,options", [
    (TRL, "accuracy_reward", "trl", "answer_tag", {}),
    (EASYR1, "compute_score", "easyr1", "boxed_math", {"format_weight": 0.25}),
    (EASYR1, "compute_score_sequential", "easyr1_sequential", "boxed_math", {}),
    (SWIFT, "AnswerAccuracy", "swift", "answer_tag", {}),
    (ASYNC_TRL, "judge_reward", "trl", "answer_tag", {}),
])
def test_each_convention_scores_exactly_like_its_native_twin(tmp_path, source, fn, style, twin,
                                                             options):
    theirs = combined(tmp_path, source, fn, **options)
    native = build_combined([{"name": f"{write(tmp_path, NATIVE, 'native.py')}:{twin}",
                              **options}])
    assert theirs.parts[0][2].user.style == style                  # found from the signature
    got = theirs.score_groups(EXAMPLES, GROUPS)
    want = native.score_groups(EXAMPLES, GROUPS)
    assert [[own(r, fn) for r in g] for g in got] == [[own(r, twin) for r in g] for g in want]
    assert sum(r["overall"] for g in got for r in g) > 0            # the twins agree on hits
    assert all(r[f"{fn}/failed"] == 0.0 for g in got for r in g)
    inline = rewards.get(f"{tmp_path / 'my_reward.py'}:{fn}", **options)   # no isolation
    assert [[{k: v for k, v in r.items() if k != "skipped"} for r in inline.score(ex, g)]
            for ex, g in zip(EXAMPLES, GROUPS)] == [[own(r, twin) for r in g] for g in want]


def test_a_batched_function_is_called_once_per_group_with_every_column(tmp_path):
    reward = combined(tmp_path, """
        CALLS = []

        def spy(prompts, completions, completion_ids, **kwargs):
            CALLS.append(dict(prompts=prompts, completions=completions,
                              completion_ids=completion_ids, **kwargs))
            return [0.5] * len(completions)
    """, "spy")
    ids = [[[1, 2, 3], [4], [], [5, 6]] for _ in GROUPS]
    reward.score_groups(EXAMPLES, GROUPS, completion_ids=ids)
    calls = reward.parts[0][2].reward.__globals__["CALLS"]
    assert len(calls) == 3 and [c["completions"] for c in calls] == GROUPS
    last = calls[2]
    assert last["prompts"] == ["Area of a 3 by 4 rectangle?"] * 4
    assert last["solution"] == last["answer"] == ["12"] * 4
    assert last["level"] == ["hard"] * 4 and last["unit"] == ["cm2"] * 4     # meta columns
    assert last["images"] == [["rect.png"]] * 4 and "audios" not in last
    assert last["completion_ids"] == [[1, 2, 3], [4], [], [5, 6]]
    assert last["trainer_state"] is None
    assert "unit" not in calls[0]                      # each group gets its own example's columns


def test_a_function_without_kwargs_gets_only_the_names_it_takes(tmp_path):
    reward = combined(tmp_path, """
        def strict(completions, solution):
            return [float(c.endswith(s)) for c, s in zip(completions, solution)]
    """, "strict")
    rows = reward.score(EXAMPLES[0], ["5", "4", "25"])
    assert [r["strict"] for r in rows] == [1.0, 0.0, 1.0]


def test_easyr1_gets_exactly_its_reward_inputs(tmp_path):
    source = """
        SEEN = []

        def compute_score(reward_inputs, scale=1.0):
            SEEN.extend(reward_inputs)
            return [{"overall": scale * len(r["response"])} for r in reward_inputs]
    """
    reward = combined(tmp_path, source, "compute_score", scale=2.0)
    rows = reward.score(EXAMPLES[1], ["ab", "abc"], completion_ids=[[7, 8], [9]])
    assert [r["compute_score"] for r in rows] == [4.0, 6.0]            # options reach the call
    seen = reward.parts[0][2].reward.__globals__["SEEN"]
    assert seen == [{"response": "ab", "response_length": 2, "ground_truth": "42"},
                    {"response": "abc", "response_length": 1, "ground_truth": "42"}]
    reward.score(EXAMPLES[1], ["x"])
    assert seen[-1]["response_length"] is None                  # no token ids from the caller


def test_swift_gets_completions_positionally_and_the_chat_as_messages(tmp_path):
    reward = combined(tmp_path, """
        class Echo:
            def __init__(self, bonus=0.0):
                self.bonus, self.seen = bonus, None

            def __call__(self, completions, **kwargs):
                self.seen = kwargs
                return [len(c) + self.bonus for c in completions]
    """, "Echo", bonus=0.5)
    rows = reward.score(EXAMPLES[0], ["abc", "d"])
    assert [r["Echo"] for r in rows] == [3.5, 1.5]                      # options build the class
    seen = reward.parts[0][2].reward.seen
    assert seen["solution"] == ["5", "5"] and seen["level"] == ["easy", "easy"]
    assert seen["messages"][1] == [{"role": "user", "content": "What is 2 + 3?"},
                                   {"role": "assistant", "content": "d"}]


def test_trl_conversational_passes_chat_messages_and_strings_say_so(tmp_path):
    source = """
        def format_reward(completions, **kwargs):
            return [float(c[0]["content"].startswith("<think>")) for c in completions]
    """
    reward = combined(tmp_path, source, "format_reward", style="trl_conversational")
    rows = reward.score(EXAMPLES[0], ["<think>a</think>", "b"])
    assert [r["format_reward"] for r in rows] == [1.0, 0.0]
    assert [r["format_reward/failed"] for r in rows] == [0.0, 0.0]
    as_text = combined(tmp_path, source, "format_reward")               # strings by default
    assert [r["format_reward/failed_error"] for r in as_text.score(EXAMPLES[0], ["a"])] == [1.0]
    assert "set `style: trl_conversational`" in log_lines(tmp_path)[0]["detail"]



def test_a_detected_trl_reward_follows_the_data_as_trl_does(tmp_path):
    source = """
        def shape(prompts, completions, **kwargs):
            return [float(isinstance(p, list) and isinstance(c, list)
                          and p[0]["content"] == "Be brief." and c[0]["content"] == "x")
                    for p, c in zip(prompts, completions)]
    """
    chat_row = Example(id="c", prompt="Count.", answer="3", meta={"system": "Be brief."}, chat=True)
    text_row = Example(id="t", prompt="Count.", answer="3", meta={"system": "Be brief."})
    detected = combined(tmp_path, source, "shape")
    assert detected.score(chat_row, ["x"])[0]["shape"] == 1.0         # chat rows: messages
    assert detected.score(text_row, ["x"])[0]["shape"] == 0.0         # text rows: strings
    named = combined(tmp_path, source, "shape", style="trl")           # a named style is kept
    assert named.score(chat_row, ["x"])[0]["shape"] == 0.0

def test_style_forces_a_convention_the_names_do_not_show(tmp_path):
    source = EASYR1.replace("reward_inputs", "batch")
    with pytest.raises(ConventionError, match="matches no reward convention"):
        combined(tmp_path, source, "compute_score")
    forced = combined(tmp_path, source, "compute_score", style="easyr1")
    native = build_combined([{"name": f"{write(tmp_path, NATIVE, 'native.py')}:boxed_math"}])
    assert [own(r, "compute_score") for r in forced.score(EXAMPLES[2], GROUPS[2])] == \
        [own(r, "boxed_math") for r in native.score(EXAMPLES[2], GROUPS[2])]
    swift = combined(tmp_path, TRL, "accuracy_reward", style="swift")       # trl by default
    assert swift.parts[0][2].user.style == "swift"
    assert [r["accuracy_reward"] for r in swift.score(EXAMPLES[0], GROUPS[0])] == [1, 0, 0, 0]
    with pytest.raises(ConventionError, match="cannot be called as style 'easyr1'"):
        combined(tmp_path, NATIVE, "answer_tag", style="easyr1")
    with pytest.raises(ConventionError, match="unknown style 'trl2' \\(did you mean 'trl'\\?\\)"):
        combined(tmp_path, TRL, "accuracy_reward", style="trl2")


def test_a_function_matching_no_convention_shows_the_accepted_signatures(tmp_path):
    path = write(tmp_path, """
        def grade(text, strict=True):
            return 1.0
    """)
    with pytest.raises(ConventionError) as error:
        rewards.get(f"{path}:grade")
    message = str(error.value)
    assert message.startswith(f"reward '{path}:grade': grade(text, strict=True) matches no")
    for style, line in SIGNATURES.items():
        assert f"  {style:<19} {line}\n" in message                         # one line each
    assert "style:" in message


def test_none_means_not_applicable_scores_zero_and_is_counted_as_skipped(tmp_path):
    reward = combined(tmp_path, """
        def only_tagged(completions, **kwargs):
            return [float("5" in c) if "<answer>" in c else None for c in completions]
    """, "only_tagged", failure_value=-1.0)
    rows = reward.score(EXAMPLES[0], ["<answer>5</answer>", "5", "<answer>4</answer>", "x"])
    assert [r["only_tagged"] for r in rows] == [1.0, 0.0, 0.0, 0.0]       # not failure_value
    assert [r["only_tagged/skipped"] for r in rows] == [0.0, 1.0, 0.0, 1.0]
    assert all(r["only_tagged/failed"] == 0.0 for r in rows)
    assert reward.all_failed([reward.score(EXAMPLES[0], ["a", "b"])]) is None   # not broken
    assert not log_lines(tmp_path)


def flags(row: dict, name: str) -> dict[str, float]:
    return {k.split("/", 1)[1]: v for k, v in row.items() if k.startswith(f"{name}/failed")}


def failed(kind: str) -> dict[str, float]:
    return {"failed": 1.0, **{f"failed_{k}": float(k == kind) for k in FAILURE_KINDS}}


@pytest.mark.parametrize("source,fn,kinds,detail", [
    ("""
        def accuracy_reward(completions, solution, **kwargs):
            return [float(c == s) for c, s in zip(completions, solution["gold"])]
     """, "accuracy_reward", ["error"] * 3, "TypeError: list indices must be integers"),
    ("""
        def compute_score(reward_inputs):
            return [{"overall": 1.0}]
     """, "compute_score", ["type"] * 3, "compute_score() returned 1 results for 3 completions"),
    ("""
        class Judge:
            def __call__(self, completions, **kwargs):
                return ["high", 1.0, float("nan")]
     """, "Judge", ["type", None, "nonfinite"], "'high' (str), not a number"),
    ("""
        def compute_score(reward_input):
            return {"overall": 1.0} if reward_input["response"] == "a" else {"score": 1}
     """, "compute_score", [None, "type", "type"], "without 'overall'"),
    ("""
        async def judge(prompts, completions, **kwargs):
            raise ConnectionError("judge server unreachable")
     """, "judge", ["error"] * 3, "ConnectionError: judge server unreachable"),
])
def test_every_convention_is_isolated(tmp_path, source, fn, kinds, detail):
    reward = combined(tmp_path, source, fn)
    rows = reward.score(EXAMPLES[0], ["a", "b", "c"])
    for row, kind in zip(rows, kinds):
        assert flags(row, fn) == (failed(kind) if kind else
                                  {"failed": 0.0, **{f"failed_{k}": 0.0 for k in FAILURE_KINDS}})
        assert row[fn] == (0.0 if kind else 1.0)
    lines = log_lines(tmp_path)
    assert lines and detail in lines[0]["detail"] and lines[0]["reward"] == fn
    if lines[0]["kind"] == "error":                            # the user's frames, not ours
        assert "my_reward.py" in lines[0]["detail"]
        assert not any(f"rewards/{module}.py" in lines[0]["detail"]
                       for module in ("base", "isolation", "conventions", "workers"))


def test_an_async_reward_scores_several_groups_at_once(tmp_path):
    """Every group's call is in flight before any returns (an order, not a duration: a busy
    machine cannot fail it)."""
    reward = combined(tmp_path, """
        import asyncio, time

        SPANS = []

        async def slow_judge(prompts, completions, **kwargs):
            start = time.monotonic()
            await asyncio.sleep(0.5)
            SPANS.append((start, time.monotonic()))
            return [1.0] * len(completions)
    """, "slow_judge")
    scores = reward.score_groups(EXAMPLES * 2, GROUPS * 2)
    assert all(r["slow_judge"] == 1.0 for g in scores for r in g)
    spans = reward.parts[0][2].reward.__globals__["SPANS"]
    assert len(spans) == 6 and max(s for s, _ in spans) < min(e for _, e in spans)   # 6 at once


def test_an_async_reward_that_hangs_is_cancelled_at_its_timeout(tmp_path):
    reward = combined(tmp_path, """
        import asyncio

        async def judge(example, completion):
            if completion == "hang":
                await asyncio.Event().wait()
            return 1.0
    """, "judge", timeout_s=0.3)
    start = time.perf_counter()
    rows = reward.score(EXAMPLES[0], ["a", "hang", "b"])
    assert time.perf_counter() - start < 30         # the hang never ends: the timeout ended it
    assert [r["judge"] for r in rows] == [1.0, 0.0, 1.0]
    assert [r["judge/failed_timeout"] for r in rows] == [0.0, 1.0, 0.0]
    [line] = log_lines(tmp_path)
    assert line["completion"] == 1 and "asyncio.Event().wait()" in line["detail"]
    assert reward.parts[0][2].hung == 0                          # cancelled, not left running


def test_an_async_reward_that_blocks_its_loop_times_out_and_the_run_goes_on(tmp_path):
    reward = combined(tmp_path, """
        import time

        async def blocking(prompts, completions, **kwargs):
            time.sleep(3600)                                     # a sync call in async code
    """, "blocking", timeout_s=0.2)
    start = time.perf_counter()
    rows = reward.score(EXAMPLES[0], ["a", "b"])
    assert time.perf_counter() - start < 60         # not the hour the blocked loop sleeps
    assert all(r["blocking/failed_timeout"] == 1.0 for r in rows)
    assert "time.sleep(3600)" in log_lines(tmp_path)[0]["detail"]
    assert reward.parts[0][2].hung == 1


def test_inline_use_raises_on_a_value_it_cannot_use(tmp_path):
    path = write(tmp_path, """
        def accuracy_reward(completions, **kwargs):
            return ["1.0" for _ in completions]
    """)
    with pytest.raises(ValueError, match="'overall' is '1.0' \\(str\\), not a number"):
        rewards.get(f"{path}:accuracy_reward").score(EXAMPLES[0], ["a"])
