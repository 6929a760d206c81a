"""Isolation of user rewards: a timeout per call, and failures scored, counted and logged.

A user's reward (`path/file.py:function`) is code the run cannot trust: it may raise, return a
string, None or NaN, or never return. `build_combined` wraps every user reward in `Isolated`:
each call runs under `timeout_s` — a plain function on a daemon worker thread, an `async def` on
one event loop kept for the reward's life — once per completion or once per group, as its
convention calls it (`rewards.conventions`). A call that raises, times out or returns anything
but finite numbers scores `failure_value` for the completions it concerns, and every
completion's dict says so in `failed` and `failed_<kind>` (kinds: timeout, error, type,
nonfinite), which the trainer averages into per-step failure rates. The first failures go to a
JSONL log; `Combined.all_failed` tells the trainer when a reward failed on every completion of a
step. Built-in rewards run inline unless their spec asks for `timeout_s`, `failure_value` or
`isolation`. An exception of any kind from the reward counts as an `error`: SystemExit,
KeyboardInterrupt and MemoryError raised inside it too (a real Ctrl-C reaches the trainer's main
thread, never a reward's worker, so it is not caught here).

`isolation: process` (off by default) runs the reward in a worker process of its own
(`rewards.process`): `os._exit`, a segfault, a call past `timeout_s` (killed, not left running)
or a reward over its `memory_mb` cap cost that call, counted, and a restart.

User rewards run on a worker thread, so anything that only works on the main thread fails there:
math_verify's default signal-based parse timeout raises (pass `parsing_timeout=None`, or use
`rewards.verify`, which is thread-safe).
"""
from __future__ import annotations

import copy
import json
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from mmrlvr.data import Example
from rewards.workers import Call, EventLoop, Pool, settle

FAILURE_KINDS = ("timeout", "error", "type", "nonfinite")
FLOAT32_MAX = 3.4028234663852886e38


class ScoresGroups:
    """`score` of one group through the class's `score_groups` (several groups at once)."""

    def score(self, example: Example, completions: list[str], progress: float = 0.0,
              completion_ids: list[list[int]] | None = None) -> list[dict[str, float]]:
        """The group's dicts; `progress` in [0, 1] is how far training is (annealed rewards read
        it); `completion_ids` (token ids per completion, optional) reach the user rewards that
        take them (TRL's `completion_ids`, EasyR1's `response_length`)."""
        ids = None if completion_ids is None else [completion_ids]
        return self.score_groups([example], [completions], progress, ids)[0]


class RewardError(RuntimeError):
    """A reward the run cannot go on with: it hangs, or it fails on every completion."""


class Failure(Exception):
    """Why one call's result cannot be used: a kind from FAILURE_KINDS and the text to log."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind, self.detail = kind, detail


def short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


def _number(value: Any, what: str) -> float:
    """`value` as a finite float (bools and numpy/torch scalars count as numbers; text does not)."""
    if isinstance(value, (str, bytes)) or value is None:
        raise Failure("type", f"{what} is {short(value)} ({type(value).__name__}), not a number")
    try:
        number = float(value)
    except Exception:   # noqa: BLE001 -- anything float() refuses is a wrong type
        raise Failure("type", f"{what} is {short(value)} ({type(value).__name__}), "
                              "not a number") from None
    if not math.isfinite(number):
        raise Failure("nonfinite", f"{what} is {short(value)}")
    if abs(number) > FLOAT32_MAX:            # rewards become float32 tensors: it would be inf
        raise Failure("nonfinite", f"{what} is {short(value)}, outside float32's range")
    return number


def checked(value: Any) -> dict[str, float]:
    """One completion's result (a number, or a dict with `overall`) as a dict of finite floats."""
    if isinstance(value, dict):
        if "overall" not in value:
            raise Failure("type", f"returned a dict without 'overall': {short(value)}")
        return {k: _number(v, f"'{k}'") for k, v in value.items()}
    return {"overall": _number(value, "the score")}


class Isolated(ScoresGroups):
    """A reward whose calls run under a timeout and whose failures score `failure_value`.

    Each completion's dict is the reward's own, plus `failed` (1.0 or 0.0) and `failed_<kind>`
    for each kind in FAILURE_KINDS (names the wrapper owns). A failed completion's components
    are 0.0, and so is a component one completion leaves out that the reward has returned
    before: every dict has the keys of those before it, so averaging a step's dicts by the first
    one's keys cannot fail. `max_hung` timed-out calls still running raise `RewardError`: the
    function hangs, and the run stops rather than pile up threads.

    `user` is a `rewards.conventions.UserReward`: what to call (`fn`, `is_async`), with which
    arguments (`calls(...)` -> list of Call), how to read one call's value (`items(value, size)`,
    raising Failure), the components every result has, and the user's own object (`obj`).
    `worker` (a `rewards.process.Worker`, `isolation: process`) runs the calls in a process.
    """

    def __init__(self, user: Any, name: str, *, timeout_s: float = 30.0,
                 failure_value: float = 0.0, error_log: str | Path | None = None,
                 max_logged: int = 20, max_hung: int = 8, worker: Any = None):
        if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                or not 0 < timeout_s < math.inf):
            raise ValueError(f"reward {name}: timeout_s must be a positive number of seconds, "
                             f"got {timeout_s!r}")
        if (isinstance(failure_value, bool) or not isinstance(failure_value, (int, float))
                or not math.isfinite(failure_value)):
            raise ValueError(f"reward {name}: failure_value must be a finite number, got "
                             f"{failure_value!r}")
        self.user, self.name = user, name
        self.timeout_s, self.failure_value = float(timeout_s), float(failure_value)
        self.error_log = Path(error_log) if error_log is not None else None
        self.max_logged, self.max_hung = max_logged, max_hung
        self.logged = 0
        self.first_failure: dict[str, Any] | None = None   # the first since the last success
        self._components = dict.fromkeys(user.components)   # component keys seen, in order
        self._worker = worker          # a rewards.process.Worker: calls run there instead
        self._pool = Pool(name)
        self._loop = EventLoop(name) if user.is_async and self._worker is None else None

    @property
    def reward(self) -> Any:
        """What the user wrote: the function, or the object whose method is called."""
        return self.user.obj

    @property
    def hung(self) -> int:
        """Calls that ran past the timeout and have not returned yet (none in a process: a
        stuck one is killed)."""
        return self._pool.outstanding + (self._loop.outstanding if self._loop else 0)

    @property
    def worker(self) -> Any:
        """The `rewards.process.Worker` under `isolation: process`, else None."""
        return self._worker

    def score_groups(self, examples: list[Example], groups: list[list[str]], progress: float = 0.0,
                     completion_ids: list[list[list[int]]] | None = None
                     ) -> list[list[dict[str, float]]]:
        """`score` of several groups; an async reward's calls for all of them run at once."""
        ids = completion_ids or [None] * len(groups)
        # every call gets its own copy of the example and its columns: a reward that edits them
        # (clears `images`, sets `answer`) changes nothing the run or the next call reads (a
        # worker process gets a copy by pickle)
        own = copy.deepcopy if self._worker is None else (lambda call: call)
        plans = [[own(call) for call in self.user.calls(ex, list(texts), progress, group_ids)]
                 for ex, texts, group_ids in zip(examples, groups, ids)]
        statuses = iter(self._run([call for plan in plans for call in plan]))
        out = []
        for example, texts, plan in zip(examples, groups, plans):
            rows: list[dict[str, float]] = []
            for (_, _, size), (status, value) in zip(plan, statuses):
                outcomes = self._outcomes(status, value, size)
                if isinstance(outcomes, Failure) and size > 1:   # the whole call: one to log
                    self._record(example, None, None, outcomes)
                    rows += [self._row(outcomes) for _ in range(size)]
                    continue
                for outcome in outcomes if isinstance(outcomes, list) else [outcomes]:
                    if isinstance(outcome, Failure):
                        self._record(example, len(rows), texts[len(rows)], outcome)
                    rows.append(self._row(outcome))
            out.append(rows)
        return out

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

    def _run(self, calls: list[Call]) -> list[tuple[str, Any]]:
        """Each call's (status, value): one by one on the pool, or all at once on the loop (or
        the same in the worker process)."""
        if self._worker is not None:
            return self._worker.run(calls, self.timeout_s, self.user.is_async)
        if self._loop is None:
            return [self._call(args, kwargs) for args, kwargs, _ in calls]
        # each call has timeout_s inside the loop; this outer limit only fires when the loop
        # itself is blocked (a synchronous wait inside an `async def`)
        status, value = self._loop.submit(settle(self.user.fn, calls, self.timeout_s),
                                          self.timeout_s + min(self.timeout_s, 5.0))
        if status == "ok":
            return value
        if status == "timeout":
            self._check_hung(value)
        return [(status, value)] * len(calls)

    def _call(self, args: tuple, kwargs: dict) -> tuple[str, Any]:
        status, value = self._pool.call(self.user.fn, args, kwargs, self.timeout_s)
        if status == "timeout":
            self._check_hung(value)
        return status, value

    def _check_hung(self, where: str) -> None:
        if self.hung >= self.max_hung:
            raise RewardError(
                f"reward {self.name} hangs: {self.hung} of its calls ran past "
                f"timeout_s={self.timeout_s:g} s and have not returned (a thread cannot be "
                f"stopped, so the run stops instead). The last one is at:\n{where.rstrip()}\n"
                "Make the function return in time, or raise the reward's timeout_s.")

    def _outcomes(self, status: str, value: Any,
                  size: int) -> list[dict[str, float] | Failure] | Failure:
        """Each completion's outcome from one call, or the one failure of the whole call."""
        if status == "timeout":
            return Failure("timeout", f"no result after timeout_s={self.timeout_s:g} s; "
                                      f"the call is at:\n{value}")
        if status == "error":
            return Failure("error", value + self.user.hint(value))
        try:
            items = self.user.items(value, size)
        except Failure as failure:
            return failure
        out: list[dict[str, float] | Failure] = []
        for item in items:
            try:
                out.append(checked(item))
            except Failure as failure:
                out.append(failure)
        return out

    def _row(self, outcome: dict[str, float] | Failure) -> dict[str, float]:
        failed = isinstance(outcome, Failure)
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
                failure: Failure) -> None:
        record = {"time": datetime.now().astimezone().isoformat(timespec="seconds"),
                  "reward": self.name, "kind": failure.kind, "example": example.id,
                  "completion": index, "detail": failure.detail,
                  "text": None if text is None else text[:500]}
        if self.first_failure is None:
            self.first_failure = record
        if self.error_log is None or self.logged >= self.max_logged:
            return
        self.logged += 1
        try:
            self.error_log.parent.mkdir(parents=True, exist_ok=True)
            with self.error_log.open("a") as fh:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        except OSError as err:     # a full disk: the failures are still counted in the metrics
            self.logged = self.max_logged
            print(f"warning: reward {self.name}: cannot write {self.error_log} "
                  f"({err.strerror or err}); its failures are still counted, no more are logged",
                  file=sys.stderr)
