"""A method's mechanism check: is the thing the method changes active on this starting model and
data, before any run compares it (`mmrlvr check-method NAME`; docs/harness.md, "Mechanism checks").

A comparison of a method against plain GRPO reads nothing about the method when its mechanism did
nothing (NC-GRPO noise that changes no answer, a step reward no completion can earn, a vote that
is wrong more often than right). Each method registers one check under its name in
`mmrlvr.core.registry.METHOD_CHECKS`: a function `check(ctx: CheckContext) -> CheckResult` that
measures its figures and says `active` or `inactive`, and why, against a floor it documents.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mmrlvr.config import ConfigError
from mmrlvr.core.prompting import Prompting

VERDICTS = ("active", "inactive")


@dataclass
class CheckOptions:
    """What a mechanism check samples (the `mmrlvr check-method` flags)."""

    rows: int = 0
    """Rows of the data read from its start (0: the check's own default)."""
    group: int = 8
    """Completions sampled per question (G)."""
    max_new_tokens: int = 64
    """Tokens generated per completion."""
    temperature: float = 1.0
    """Sampling temperature."""
    system_prompt: str = ""
    """System turn of every prompt ("": none, or the row's own)."""
    format_prompt: str = ""
    """Instruction appended to every prompt ("": none, as `mmrlvr eval`'s default)."""
    seed: int = 0
    """torch seed set before sampling."""
    method: dict[str, Any] = field(default_factory=dict)
    """The method's own settings (`--option key=value`), e.g. NC-GRPO's `alpha`."""

    @property
    def prompting(self) -> Prompting:
        """The questions' system turn and format instruction, as a run's eval asks them."""
        return Prompting(system=self.system_prompt, format=self.format_prompt)


@dataclass
class CheckContext:
    """What a check reads: the data's rows, the options, and the starting model (loaded on first
    use, so a data-only check loads no weights)."""

    examples: Sequence[Any]
    """The rows of `--data` (`mmrlvr.data.Example`)."""
    options: CheckOptions = field(default_factory=CheckOptions)
    load_policy: Callable[[], Any] | None = None
    """Loads the starting model's `Policy`; None where no `--model` was given."""
    config: Any = None
    """The run config the check stands in for (`--config`: a `mmrlvr.config.Config`), or None."""
    _policy: Any = None

    def policy(self, method: str) -> Any:
        if self._policy is None:
            if self.load_policy is None:
                raise ConfigError(f"check-method {method}: this check samples the starting model; "
                                  "give it with --model DIR")
            self._policy = self.load_policy()
        return self._policy

    def rows(self, default: int) -> list[Any]:
        """The first `options.rows` rows (or `default` where that is 0; 0 and 0: all)."""
        n = self.options.rows or default
        return list(self.examples[:n]) if n else list(self.examples)


@dataclass
class CheckResult:
    """A check's figures and verdict."""

    method: str
    verdict: str
    """`active` or `inactive`."""
    why: str
    """One sentence: which figure against which floor."""
    figures: dict[str, float]
    floors: dict[str, float]
    """The thresholds the verdict used, by name."""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"check {self.method}: verdict must be one of {VERDICTS}, got {self.verdict!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
