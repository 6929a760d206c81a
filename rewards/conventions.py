"""How a user's reward is called: the conventions of mmrlvr, TRL, EasyR1 and ms-swift.

A reward from `path/file.py:name` (or a registered plain function) may be written for any of
these trainers. Its signature says which, or `style:` in the reward spec names it
(`rewards: [{name: my.py:f, style: trl, weight: 1}]`):

    style               signature                                               called
    native              f(example, completion, **options) -> float | dict       per completion
    native              obj.score(example, completions[, progress]) -> [dict]   per group
    trl                 f(prompts, completions, completion_ids, **kwargs)
                          -> list[float | None]                                 per group
    trl_conversational  the same, prompts and completions as chat messages      per group
    easyr1              compute_score(reward_inputs, **options) -> list[dict]   per group
    easyr1_sequential   compute_score(reward_input, **options) -> dict          per completion
    swift               class X(ORM): __call__(self, completions, **kwargs)
                          -> list[float | None]                                 per group

Detection, when no `style` is given: a class or object with a `score` method is native; any other
class is built with the spec's options (swift's ORM classes) and its instance's `__call__` is read
like a function. A function (or that `__call__`) whose first parameter is `reward_inputs` is
easyr1, `reward_input` easyr1_sequential; one with a `prompts` parameter is trl; one whose first
parameter is `completions` is trl (a function) or swift (an object); one whose first two
parameters take (example, completion) with no defaults is native. Anything else is refused with
the accepted signatures. Any of them may be `async def`: its calls for all the groups a step
scores run at once on one event loop.

What each receives (`example` is the `mmrlvr.data.Example` of the group):
- trl: `prompts` (the prompt text, once per completion; messages `[{"role": "user", ...}]` for
  trl_conversational), `completions` (strings; `[{"role": "assistant", "content": ...}]` for
  trl_conversational). A detected (not named) trl reward follows the data, as TRL does: rows
  whose prompt was chat messages (`example.chat`) get the conversational form, with the
  system turn leading the prompt; `completion_ids` (token ids per completion when the caller passes them,
  else None), `trainer_state=None`, and every dataset column as a list with one entry per
  completion: the gold as `solution` and as `answer`, `images`/`audios`/`choices`/`steps`/
  `reasoning` where the example has them, and every key of `example.meta` by its own name (a
  meta key wins over those). A function without `**kwargs` gets only the names it takes.
- swift: `completions` (strings) positionally, the same columns, `messages` (the user turn and
  this completion as the assistant turn, as swift appends it) and `trainer_state=None`.
- easyr1: one dict per completion with exactly EasyR1's keys: `response`, `response_length`
  (its token count when the caller passes completion ids, else None) and `ground_truth`.
- The spec's other keys are options: keyword arguments of each call (EasyR1's
  `reward_function_kwargs`), or of the class for objects.
- Multi-turn rollouts with tools (docs/tools.md): each completion is the final turn's text, a
  `str` carrying `.trajectory` (turns, tool calls, results); a native function naming a
  `trajectory` parameter gets it, trl and swift get the column `trajectories`, and a group
  reward's `score` reads `completion.trajectory`. Single-turn calls are exactly as before.

A TRL or swift score of None means "not applicable" (TRL leaves it out of its sum): it scores 0,
is not a failure, and the component `skipped` (1.0 or 0.0, on every completion) counts it.
"""
from __future__ import annotations

import difflib
import functools
import inspect
from typing import Any, Callable

from mmrlvr.config import ConfigError
from mmrlvr.core.trajectory import trajectory_of
from mmrlvr.data import Example
from rewards.isolation import Failure, ScoresGroups, checked, short
from rewards.workers import Call, EventLoop, settle

SIGNATURES = {
    "native": "f(example, completion, **options) -> float | dict with 'overall'   "
              "(or an object with score(example, completions, progress=0.0) -> list[dict])",
    "trl": "f(prompts, completions, completion_ids, **kwargs) -> list[float | None]",
    "trl_conversational": "as trl, with prompts and completions as chat message lists",
    "easyr1": "compute_score(reward_inputs: list[dict], **options) -> list[dict with 'overall']",
    "easyr1_sequential": "compute_score(reward_input: dict, **options) -> dict with 'overall'",
    "swift": "class X(ORM): def __call__(self, completions, **kwargs) -> list[float | None]",
}


class ConventionError(ConfigError, TypeError):
    """A reward whose signature matches no convention, or an unknown `style`."""


def accepted() -> str:
    """The accepted signatures, one line each."""
    return "\n".join(f"  {style:<19} {line}" for style, line in SIGNATURES.items())


class UserReward(ScoresGroups):
    """A user's function, called the way its own trainer calls it, as a group reward."""

    style = "native"
    components: tuple[str, ...] = ()
    returns = "a list of {n} results"

    def __init__(self, fn: Callable[..., Any], name: str, obj: Any = None,
                 options: dict[str, Any] | None = None):
        self.fn, self.name = fn, name
        self.obj = fn if obj is None else obj
        self.options = dict(options or {})
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(type(fn), "__call__", None))
        params = _parameters(fn)
        self._takes = None if any(p.kind is p.VAR_KEYWORD for p in params) else \
            {p.name for p in params}
        self._loop: EventLoop | None = None
        self.detected = False
        """The style was told from the signature, not named: a TRL reward then follows the
        dataset (chat messages for rows whose prompt was chat, as TRL does)."""
        self.call_name = (f"{fn.__name__}()" if hasattr(fn, "__name__")
                          else f"{type(fn).__name__}.__call__()")

    def calls(self, example: Example, completions: list[str], progress: float,
              completion_ids: list[list[int]] | None) -> list[Call]:
        raise NotImplementedError

    def items(self, value: Any, size: int) -> list[Any]:
        """A batched call's return value as `size` per-completion results."""
        if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
            value = value.tolist()                    # numpy arrays, torch tensors
        if not isinstance(value, (list, tuple)) or len(value) != size:
            what = f"{len(value)} results" if isinstance(value, (list, tuple)) else short(value)
            raise Failure("type", f"{self.call_name} returned {what} for {size} completions; "
                                  f"expected {self.returns.format(n=size)}")
        return [self.item(raw) for raw in value]

    def item(self, raw: Any) -> Any:
        return raw

    def hint(self, error: str) -> str:
        """What to do about a call's error, where the convention knows a usual cause."""
        return ""

    def _fit(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The implicit keyword arguments the function takes (all of them with **kwargs)."""
        return kwargs if self._takes is None else {k: v for k, v in kwargs.items()
                                                   if k in self._takes}

    def score_groups(self, examples: list[Example], groups: list[list[str]], progress: float = 0.0,
                     completion_ids: list[list[list[int]]] | None = None
                     ) -> list[list[dict[str, float]]]:
        """Inline, without isolation: the function's exceptions propagate, bad values raise."""
        ids = completion_ids or [None] * len(groups)
        plans = [self.calls(ex, list(texts), progress, group_ids)
                 for ex, texts, group_ids in zip(examples, groups, ids)]
        flat = [call for plan in plans for call in plan]
        if self.is_async:
            self._loop = self._loop or EventLoop(self.name)
            values = []
            for status, value in self._loop.run(settle(self.fn, flat, None)):
                if status != "ok":
                    raise RuntimeError(f"reward {self.name} failed:\n{value}")
                values.append(value)
        else:
            values = [self.fn(*args, **kwargs) for args, kwargs, _ in flat]
        values = iter(values)
        try:
            return [[checked(item) for (_, _, size), value in zip(plan, values)
                     for item in self.items(value, size)] for plan in plans]
        except Failure as failure:
            raise ValueError(f"reward {self.name}: {failure.detail}") from None


class Native(UserReward):
    """`f(example, completion, **options)`, once per completion; one that names a `trajectory`
    parameter also gets the completion's multi-turn trajectory (None for a single turn)."""

    def calls(self, example, completions, progress, completion_ids):
        if self._takes is not None and "trajectory" in self._takes:
            return [((example, text), {**self.options, "trajectory": trajectory_of(text)}, 1)
                    for text in completions]
        return [((example, text), self.options, 1) for text in completions]

    def items(self, value, size):
        return [value]


class Group(UserReward):
    """An object with `score(example, completions[, progress][, completion_ids])`, per group."""

    returns = "a list of {n} dicts with 'overall'"

    def __init__(self, obj: Any, name: str):
        super().__init__(obj.score, name, obj)
        self.call_name = "score()"

    def calls(self, example, completions, progress, completion_ids):
        kwargs = self._fit({"progress": progress, "completion_ids": completion_ids})
        if completion_ids is None:
            kwargs.pop("completion_ids", None)
        return [((example, completions), kwargs, len(completions))]


def trajectories(completions: list[str]) -> dict[str, Any]:
    """`trajectories` (one `mmrlvr.core.trajectory.Trajectory` per completion) where the
    completions come from a multi-turn rollout, as a column TRL and swift rewards may take;
    nothing for single-turn ones (the call is as before)."""
    found = [trajectory_of(t) for t in completions]
    return {"trajectories": found} if any(t is not None for t in found) else {}


def columns(example: Example) -> dict[str, Any]:
    """The example's dataset columns as TRL and ms-swift pass them (one value per column)."""
    row: dict[str, Any] = {"solution": example.answer, "answer": example.answer}
    for key in ("images", "audios", "choices", "steps", "reasoning"):
        if getattr(example, key):
            row[key] = getattr(example, key)
    row.update(example.meta)
    return row


class Trl(UserReward):
    """TRL's `f(prompts=, completions=, completion_ids=, **columns)`, per group."""

    style = "trl"
    components = ("skipped",)
    returns = "a list of {n} floats (None: not applicable)"
    chat = False

    def calls(self, example, completions, progress, completion_ids):
        n = len(completions)
        chat = self.chat or (self.detected and example.chat)
        prompt = example.prompt
        if chat:
            system = example.meta.get("system")
            prompt = ([{"role": "system", "content": system}] if system else []) + \
                [{"role": "user", "content": example.prompt}]
        texts = [[{"role": "assistant", "content": t}] for t in completions] if chat \
            else completions
        kwargs = {key: [value] * n for key, value in columns(example).items()}
        kwargs.update(prompts=[prompt] * n, completions=texts, completion_ids=completion_ids,
                      trainer_state=None, **trajectories(completions))
        return [((), {**self._fit(kwargs), **self.options}, n)]

    def item(self, raw):
        if raw is None:
            return {"overall": 0.0, "skipped": 1.0}
        return {"overall": raw, "skipped": 0.0}

    def hint(self, error):
        if self.chat or "string indices must be integers" not in error:
            return ""
        return ("\nIt reads completions as chat messages (completion[0]['content']), as TRL passes "
                "them for conversational datasets: set `style: trl_conversational` in its spec.")


class TrlConversational(Trl):
    style = "trl_conversational"
    chat = True


class Swift(Trl):
    """An ms-swift ORM: `orm(completions, **columns)`, per group."""

    style = "swift"

    def calls(self, example, completions, progress, completion_ids):
        n = len(completions)
        kwargs = {key: [value] * n for key, value in columns(example).items()}
        kwargs.update(trainer_state=None, messages=[
            [{"role": "user", "content": example.prompt}, {"role": "assistant", "content": t}]
            for t in completions], **trajectories(completions))
        kwargs.pop("completions", None)
        return [((completions,), {**self._fit(kwargs), **self.options}, n)]


def _easyr1_input(example: Example, text: str, ids: list[int] | None) -> dict[str, Any]:
    return {"response": text, "response_length": None if ids is None else len(ids),
            "ground_truth": example.answer}


class EasyR1(UserReward):
    """EasyR1's batch `compute_score(reward_inputs, **options)`, per group."""

    style = "easyr1"
    returns = "a list of {n} dicts with 'overall'"

    def calls(self, example, completions, progress, completion_ids):
        ids = completion_ids or [None] * len(completions)
        inputs = [_easyr1_input(example, t, i) for t, i in zip(completions, ids)]
        return [((inputs,), self.options, len(completions))]


class EasyR1Sequential(UserReward):
    """EasyR1's sequential `compute_score(reward_input, **options)`, per completion."""

    style = "easyr1_sequential"

    def calls(self, example, completions, progress, completion_ids):
        ids = completion_ids or [None] * len(completions)
        return [((_easyr1_input(example, t, i),), self.options, 1)
                for t, i in zip(completions, ids)]

    def items(self, value, size):
        return [value]


STYLES: dict[str, type[UserReward]] = {
    "native": Native, "trl": Trl, "trl_conversational": TrlConversational, "easyr1": EasyR1,
    "easyr1_sequential": EasyR1Sequential, "swift": Swift}


def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []


def _binds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return True


def _takes_native(fn: Callable[..., Any], options: dict[str, Any]) -> bool:
    """Its first two parameters take (example, completion) without defaults, options the rest."""
    positional = [p for p in _parameters(fn) if p.kind in (p.POSITIONAL_ONLY,
                                                           p.POSITIONAL_OR_KEYWORD)]
    leading = positional[:2]
    defaults_free = len(leading) == 2 and all(p.default is p.empty for p in leading)
    var_args = any(p.kind is p.VAR_POSITIONAL for p in _parameters(fn))
    return (defaults_free or var_args) and _binds(fn, None, "", **options)


def detect(fn: Callable[..., Any], is_object: bool, options: dict[str, Any]) -> str | None:
    """The convention `fn`'s signature follows (module docstring), or None."""
    params = _parameters(fn)
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD)]
    first = positional[0] if positional else None
    if first == "reward_inputs":
        return "easyr1"
    if first == "reward_input":
        return "easyr1_sequential"
    if any(p.name == "prompts" for p in params):
        return "trl"
    if first == "completions":
        return "swift" if is_object else "trl"
    if _takes_native(fn, options):
        return "native"
    return None


def _fits(style: str, fn: Callable[..., Any], options: dict[str, Any]) -> bool:
    """Whether `fn` can be called as `style` calls it (a named style is checked, not trusted)."""
    params = _parameters(fn)
    if style == "native":
        return _takes_native(fn, options)
    if style in ("easyr1", "easyr1_sequential"):
        return _binds(fn, [], **options)
    if style == "swift":                        # completions go positionally
        return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                   for p in params)
    return any(p.name == "completions" or p.kind is p.VAR_KEYWORD for p in params)


def _refuse(fn: Callable[..., Any], name: str, why: str) -> ConventionError:
    try:
        shown = f"{getattr(fn, '__name__', type(fn).__name__)}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        shown = repr(fn)
    return ConventionError(
        f"reward {name!r}: {shown} {why}. A reward is one of:\n{accepted()}\n"
        "Any of them may be `async def`. Name the convention with `style:` in the reward spec "
        "when the parameter names differ, e.g. {name: my_reward.py:f, style: trl}.")


def adapt(obj: Any, name: str, style: str | None = None, **options: Any) -> Any:
    """`obj` (a function, class or object from a user's file, or a registered one) as a group
    reward: a native group reward as it is, anything else wrapped in its `UserReward`."""
    if style is not None and style not in STYLES:
        near = difflib.get_close_matches(str(style), STYLES, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConventionError(f"reward {name!r}: unknown style {style!r}{hint}; choose one of "
                              f"{list(STYLES)}:\n{accepted()}")
    has_score = callable(getattr(obj, "score", None))
    if isinstance(obj, type):
        if has_score and style in (None, "native"):
            return obj(**options)
        obj, options, has_score = obj(**options), {}, False   # swift builds its ORM bare
    if has_score and style in (None, "native"):
        return obj
    if not callable(obj):
        raise _refuse(obj, name, "is not callable")
    is_object = not (inspect.isfunction(obj) or inspect.ismethod(obj)
                     or inspect.isbuiltin(obj) or isinstance(obj, functools.partial))
    found = style or detect(obj, is_object, options)
    if found is None:
        raise _refuse(obj, name, "matches no reward convention")
    if not _fits(found, obj, options):
        raise _refuse(obj, name, f"cannot be called as style {found!r}")
    reward = STYLES[found](obj, name, options=options)
    reward.detected = style is None
    return reward


def lift(fn: Callable[..., Any], name: str | None = None, **options: Any) -> Native:
    """Wrap `fn(example, completion, **options) -> float | dict` as a group reward."""
    return Native(fn, name or getattr(fn, "__name__", "reward"), options=options)
