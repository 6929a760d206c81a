"""The group-scoring reward interface, the weighted combination the trainer uses, and the isolation
of user rewards.

A user's reward (`path/file.py:function`) is code the run cannot trust: it may raise, return a
string, None or NaN, or never return. `build_combined` wraps every user reward in `Isolated`:
each call runs on a daemon worker thread under `timeout_s` (per completion for a plain function,
per group for an object with `score`); a call that raises, times out or returns anything but
finite numbers scores `failure_value` for the completions it concerns, and every completion's
dict says so in `failed` and `failed_<kind>` (kinds: timeout, error, type, nonfinite), which the
trainer averages into per-step failure rates like any other component. The first failures go to a
JSONL log, and `Combined.all_failed` tells the trainer when a reward failed on every completion of
a step. Built-in (registered) rewards are trusted and run inline, exactly as before, unless their
spec asks for `timeout_s` or `failure_value`.

User rewards run on a worker thread, so anything that only works on the main thread fails there:
math_verify's default signal-based parse timeout raises (pass `parsing_timeout=None`, or use
`rewards.verify`, which is thread-safe).
"""
from __future__ import annotations

import json
import inspect
import math
import queue
import sys
import threading
import traceback
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from mmrlvr.core.types import Reward
from mmrlvr.data import Example

FAILURE_KINDS = ("timeout", "error", "type", "nonfinite")


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class RewardError(RuntimeError):
    """A reward the run cannot go on with: it hangs, or it fails on every completion."""


class _Lifted:
    """A per-completion function lifted to the group interface."""

    def __init__(self, fn: Callable[..., Any], name: str, **options: Any):
        self.fn, self.name, self.options = fn, name, options

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        out = []
        for text in completions:          # a plain function takes no progress
            value = self.fn(example, text, **self.options)
            if isinstance(value, dict):
                if "overall" not in value:
                    raise ValueError(f"reward {self.name} returned a dict without 'overall'")
                out.append({k: float(v) for k, v in value.items()})
            else:
                out.append({"overall": float(value)})
        return out


def lift(fn: Callable[..., Any], name: str | None = None, **options: Any) -> _Lifted:
    """Wrap `fn(example, completion, **options) -> float | dict` as a group reward."""
    return _Lifted(fn, name or getattr(fn, "__name__", "reward"), **options)


class _Failure(Exception):
    """Why one call's result cannot be used: a kind from FAILURE_KINDS and the text to log."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _number(value: Any, what: str) -> float:
    """`value` as a finite float (bools and numpy/torch scalars count as numbers; text does not)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise _Failure("type", f"{what} is {_short(value)} ({type(value).__name__}), not a number")
    try:
        number = float(value)
    except Exception:   # noqa: BLE001 -- anything float() refuses is a wrong type
        raise _Failure("type", f"{what} is {_short(value)} ({type(value).__name__}), "
                               "not a number") from None
    if not math.isfinite(number):
        raise _Failure("nonfinite", f"{what} is {_short(value)}")
    return number


def _checked(value: Any) -> dict[str, float]:
    """One completion's result (a number, or a dict with `overall`) as a dict of finite floats."""
    if isinstance(value, dict):
        if "overall" not in value:
            raise _Failure("type", f"returned a dict without 'overall': {_short(value)}")
        return {k: _number(v, f"'{k}'") for k, v in value.items()}
    return {"overall": _number(value, "the score")}


class _Job:
    __slots__ = ("fn", "args", "kwargs", "done", "status", "value", "thread", "abandoned")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()
        self.status, self.value, self.thread, self.abandoned = "", None, 0, False


class _Pool:
    """Daemon worker threads for one reward, started on demand, gone after a minute idle.

    Python cannot stop a thread, so a call that runs past its timeout keeps its worker; it is
    `outstanding` until it returns (then its worker serves again). Daemon threads never hold up
    the interpreter's exit.
    """

    IDLE_EXIT_S = 60.0

    def __init__(self, name: str):
        self.name = name
        self.outstanding = 0                  # timed-out calls that have not returned yet
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0                        # workers waiting for a job and not yet claimed

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
             timeout: float) -> tuple[str, Any]:
        """`fn(*args, **kwargs)` on a worker: ("ok", value), ("error", traceback text), or
        ("timeout", where the call is stuck)."""
        job = _Job(fn, args, kwargs)
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                threading.Thread(target=self._work, name=f"reward {self.name}", daemon=True).start()
            self._jobs.put(job)
        if not job.done.wait(timeout):
            with self._lock:
                if not job.done.is_set():
                    job.abandoned = True
                    self.outstanding += 1
                    return "timeout", self._stack(job.thread)
        return job.status, job.value

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._idle:   # an unclaimed idle worker may leave: claims stay covered
                        self._idle -= 1
                        return
                continue
            job.thread = threading.get_ident()
            try:
                job.status, job.value = "ok", job.fn(*job.args, **job.kwargs)
            except BaseException as exc:   # noqa: BLE001 -- even SystemExit must not end the worker
                below_us = exc.__traceback__.tb_next   # from the reward's own frame down
                job.status = "error"
                job.value = "".join(traceback.format_exception(type(exc), exc, below_us))
            with self._lock:
                job.done.set()
                if job.abandoned:
                    self.outstanding -= 1
                self._idle += 1

    @staticmethod
    def _stack(ident: int) -> str:
        frame = sys._current_frames().get(ident)
        if frame is None:
            return "(the call had not started)"
        frames = [f for f in traceback.extract_stack(frame)
                  if f.filename not in (__file__, threading.__file__)]
        return "".join(traceback.format_list(frames))


class Isolated:
    """A reward whose calls run under a timeout and whose failures score `failure_value`.

    Each completion's dict is the reward's own, plus `failed` (1.0 or 0.0) and `failed_<kind>`
    for each kind in FAILURE_KINDS (names the wrapper owns). A failed completion's components
    are 0.0, and so is a component one completion leaves out that the reward has returned
    before: every dict has the keys of those before it, so averaging a step's dicts by the first
    one's keys cannot fail. `max_hung` timed-out calls still running raise `RewardError`: the
    function hangs, and the run stops rather than pile up threads.
    """

    def __init__(self, reward: Reward, name: str, *, timeout_s: float = 30.0,
                 failure_value: float = 0.0, error_log: str | Path | None = None,
                 max_logged: int = 20, max_hung: int = 8):
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not 0 < timeout_s < math.inf):
            raise ValueError(f"reward {name}: timeout_s must be a positive number of seconds, "
                             f"got {timeout_s!r}")
        if (isinstance(failure_value, bool) or not isinstance(failure_value, (int, float))
                or not math.isfinite(failure_value)):
            raise ValueError(f"reward {name}: failure_value must be a finite number, got "
                             f"{failure_value!r}")
        self.reward, self.name = reward, name
        self.timeout_s, self.failure_value = float(timeout_s), float(failure_value)
        self.error_log = Path(error_log) if error_log is not None else None
        self.max_logged, self.max_hung = max_logged, max_hung
        self.logged = 0
        self.first_failure: dict[str, Any] | None = None   # the first since the last success
        self._components: dict[str, None] = {}             # component keys seen, in order
        self._pool = _Pool(name)
        # a user's group reward written before the protocol had `progress` still works
        self.takes_progress = isinstance(reward, _Lifted) or _accepts(reward.score, "progress")

    @property
    def hung(self) -> int:
        """Calls that ran past the timeout and have not returned yet."""
        return self._pool.outstanding

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        if isinstance(self.reward, _Lifted):
            fn, options = self.reward.fn, self.reward.options
            outcomes = [self._outcome(*self._call(fn, (example, text), options))
                        for text in completions]
        else:
            status, value = self._call(self.reward.score, (example, list(completions)),
                                       {"progress": progress} if self.takes_progress else {})
            outcomes = self._group_outcomes(status, value, len(completions))
            if isinstance(outcomes, _Failure):   # the whole call failed: one failure to log
                self._record(example, None, None, outcomes)
                return [self._row(outcomes) for _ in completions]
        rows = []
        for index, (text, outcome) in enumerate(zip(completions, outcomes)):
            if isinstance(outcome, _Failure):
                self._record(example, index, text, outcome)
            rows.append(self._row(outcome))
        return rows

    def failure_message(self, failed: int, kinds: dict[str, int]) -> str:
        """What `Combined.all_failed` says when this reward failed on all `failed` completions."""
        counts = ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n)
        first = self.first_failure or {}
        where = (f"example {first.get('example')!r}"
                 + (f", completion {first['completion']}" if first.get("completion") is not None
                    else ", the whole group"))
        hint = ("\nUser rewards run on a worker thread: turn off signal-based timeouts "
                "(math_verify: parsing_timeout=None) or use rewards.verify."
                if "main thread" in str(first.get("detail", "")) else "")
        return (f"reward {self.name} failed on every one of the {failed} completions of this step "
                f"({counts}); each scored failure_value={self.failure_value:g}, which teaches "
                f"nothing. First failure ({where}, {first.get('kind')}):\n"
                f"{first.get('detail', '(not recorded)')}{hint}")

    def _call(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> tuple[str, Any]:
        status, value = self._pool.call(fn, args, kwargs, self.timeout_s)
        if status == "timeout" and self.hung >= self.max_hung:
            raise RewardError(
                f"reward {self.name} hangs: {self.hung} of its calls ran past "
                f"timeout_s={self.timeout_s:g} s and have not returned (a thread cannot be "
                f"stopped, so the run stops instead). The last one is at:\n{value.rstrip()}\n"
                "Make the function return in time, or raise the reward's timeout_s.")
        return status, value

    def _outcome(self, status: str, value: Any) -> dict[str, float] | _Failure:
        if status == "timeout":
            return _Failure("timeout", f"no result after timeout_s={self.timeout_s:g} s; "
                                       f"the call is at:\n{value}")
        if status == "error":
            return _Failure("error", value)
        try:
            return _checked(value)
        except _Failure as failure:
            return failure

    def _group_outcomes(self, status: str, value: Any,
                        n: int) -> list[dict[str, float] | _Failure] | _Failure:
        """Each completion's outcome from a group call, or the one failure of the whole call."""
        if status != "ok":
            return self._outcome(status, value)
        if not isinstance(value, (list, tuple)) or len(value) != n:
            what = f"{len(value)} results" if isinstance(value, (list, tuple)) else _short(value)
            return _Failure("type", f"score() returned {what} for {n} completions; expected a "
                                    f"list of {n} dicts with 'overall'")
        return [self._outcome("ok", item) for item in value]

    def _row(self, outcome: dict[str, float] | _Failure) -> dict[str, float]:
        failed = isinstance(outcome, _Failure)
        if failed:
            row = {"overall": self.failure_value, **{key: 0.0 for key in self._components}}
        else:
            row = outcome
            self.first_failure = None
            for key in outcome:
                if key != "overall":
                    self._components.setdefault(key)
            for key in self._components:   # a component this completion left out reads 0
                row.setdefault(key, 0.0)
        row["failed"] = float(failed)
        for kind in FAILURE_KINDS:
            row[f"failed_{kind}"] = float(failed and outcome.kind == kind)
        return row

    def _record(self, example: Example, index: int | None, text: str | None,
                failure: _Failure) -> None:
        record = {"time": datetime.now().astimezone().isoformat(timespec="seconds"),
                  "reward": self.name, "kind": failure.kind, "example": example.id,
                  "completion": index, "detail": failure.detail,
                  "text": None if text is None else text[:500]}
        if self.first_failure is None:
            self.first_failure = record
        if self.error_log is None or self.logged >= self.max_logged:
            return
        self.logged += 1
        self.error_log.parent.mkdir(parents=True, exist_ok=True)
        with self.error_log.open("a") as fh:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


class Combined:
    """Weighted sum of several rewards; every component is kept under `name/component`."""

    def __init__(self, parts: list[tuple[str, float, Reward]]):
        if not parts:
            raise ValueError("at least one reward is needed")
        self.parts = parts

    def score(self, example: Example, completions: list[str],
              progress: float = 0.0) -> list[dict[str, float]]:
        """The weighted total and every part's components; `progress` in [0, 1] is how far
        training is (annealed rewards read it)."""
        totals = [dict(overall=0.0) for _ in completions]
        for name, weight, reward in self.parts:
            scores = reward.score(example, completions, progress=progress)
            if len(scores) != len(completions):
                raise ValueError(f"reward {name} returned {len(scores)} scores for "
                                 f"{len(completions)} completions (example {example.id})")
            for total, s in zip(totals, scores):
                total["overall"] += weight * s["overall"]
                total[name] = s["overall"]
                for key, value in s.items():
                    if key != "overall":
                        total[f"{name}/{key}"] = value
        return totals

    def all_failed(self, scores: list[list[dict[str, float]]]) -> str | None:
        """Given a step's scores (one list of dicts per group, from `score`): a message naming
        the reward and its first traceback when an isolated reward failed on every completion,
        else None. The trainer stops the run with it: such a reward is broken, not unlucky."""
        rows = [s for group in scores for s in group]
        for name, _, reward in self.parts:
            if rows and isinstance(reward, Isolated) and all(s[f"{name}/failed"] for s in rows):
                kinds = {kind: int(sum(s[f"{name}/failed_{kind}"] for s in rows))
                         for kind in FAILURE_KINDS}
                return reward.failure_message(len(rows), kinds)
        return None


def build_combined(specs: list[dict[str, Any]], error_log: str | Path | None = None) -> Combined:
    """From config: `[{name, weight, label?, timeout_s?, failure_value?, ...options}]` -> Combined.

    User rewards (`file.py:function`) are always `Isolated`; a built-in one only when its spec
    sets `timeout_s` or `failure_value`. Those two keys are the wrapper's; the other options go to
    the reward. `error_log`: the JSONL file for the first failures of each isolated reward.
    """
    import rewards

    builtin = set(rewards.names())
    parts = []
    for spec in specs:
        spec = dict(spec)
        name = spec.pop("name")
        weight = float(spec.pop("weight", 1.0))
        label = spec.pop("label", None) or name.rpartition(":")[2]
        isolation = {key: spec.pop(key) for key in ("timeout_s", "failure_value") if key in spec}
        reward = rewards.get(name, **spec)
        if name not in builtin or isolation:
            reward = Isolated(reward, label, error_log=error_log, **isolation)
        parts.append((label, weight, reward))
    return Combined(parts)
