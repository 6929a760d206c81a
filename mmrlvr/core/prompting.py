"""How a run turns an Example into what its model reads, in one object: `Prompting`.

Three settings decide it, and before this object they were passed by hand, one keyword at a
time, through every place that encodes a prompt (the step, dynamic sampling, eval, SFT, the
length check, stress tests, the demos, the method checks):

  prompt transforms   each prompt rewritten before it is encoded, drawn per step (the
                      prompt-transform hook, `PROMPT_TRANSFORMS`; `data.templates` is the
                      shipped one: the question wrapped in a template drawn from the pool)
  system turn         `data.system_prompt` (empty: the row's own `meta.system`, if any)
  format instruction  `data.format_prompt`: text appended to the question, or a Jinja template

    prompting = Prompting.of(cfg)                    # once, from the config
    draw = prompting.draw(step)                      # the step's transforms, with their own rng
    examples = draw(examples)                        # may be called again within the step
    batch = prompting.encode(policy, examples)       # adapter.encode with the system and format

Eval, SFT targets and the demos use `prompting.plain()`: the same system turn and format
instruction, and no transform (a held-out question is asked as it is written).

A prompt transform is any object with `__call__(examples, rng) -> examples` and
`variants(example) -> examples` (every prompt it can make of one example, so the length check at
load can bound the longest); it is registered by name and named in a config as
`data.prompt_transforms: [{name: NAME, ...options}]`. With no transform the draw returns the
examples themselves and takes nothing from its rng, so a run without one is the plain run, bit
for bit.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any, Protocol

from mmrlvr.core.registry import Registry
from mmrlvr.core.templates import apply_templates, render, template_rng
from mmrlvr.data import Example


class PromptTransform(Protocol):
    """Rewrites prompts before they are encoded (the prompt-transform hook)."""

    def __call__(self, examples: list[Example], rng: random.Random) -> list[Example]: ...

    def variants(self, example: Example) -> list[Example]:
        """Every prompt this transform can make of `example` (for the length bound)."""
        ...


PROMPT_TRANSFORMS = Registry("prompt transform")
"""Prompt transforms by name: `data.prompt_transforms[].name`; `templates` ships with the core."""


@PROMPT_TRANSFORMS.register("templates")
@dataclasses.dataclass(frozen=True)
class TemplatePool:
    """Each prompt wrapped in a template drawn from `templates` (one draw per prompt);
    `meta.template` records which (`mmrlvr.core.templates`). PIRL and multi-template GRPO train
    over a pool; `data.templates` is this transform."""

    templates: tuple[str, ...]

    def __call__(self, examples: list[Example], rng: random.Random) -> list[Example]:
        return apply_templates(examples, self.templates, rng)

    def variants(self, example: Example) -> list[Example]:
        return [dataclasses.replace(example, prompt=render(t, example.prompt))
                for t in self.templates]


class Draw:
    """One step's prompt transforms, with that step's own rng: the same on resume and for a
    batch drawn ahead; called again within the step (dynamic sampling), it draws on."""

    def __init__(self, transforms: Sequence[PromptTransform], rng: random.Random):
        self.transforms, self.rng = tuple(transforms), rng

    def __call__(self, examples: list[Example]) -> list[Example]:
        for transform in self.transforms:
            examples = transform(examples, self.rng)
        return examples


@dataclasses.dataclass(frozen=True)
class Prompting:
    """The system turn, the format instruction and the prompt transforms of a run."""

    system: str = ""
    """The system turn (`data.system_prompt`; empty: the row's own `meta.system`, if any)."""
    format: str = ""
    """The format instruction (`data.format_prompt`): appended text, or a Jinja template."""
    transforms: tuple[Any, ...] = ()
    """Prompt transforms applied, in order, to each step's prompts (not to eval's)."""
    seed: int = 0
    """The run's seed: each step's draw of transforms comes from (seed, step)."""

    @classmethod
    def of(cls, cfg: Any) -> "Prompting":
        """A run config's prompting: `data.system_prompt`, `data.format_prompt`, then
        `data.templates` (when set) and `data.prompt_transforms`, in that order."""
        data = cfg.data
        transforms = [TemplatePool(tuple(data.templates))] if data.templates else []
        for spec in getattr(data, "prompt_transforms", None) or []:
            options = {k: v for k, v in spec.items() if k != "name"}
            transforms.append(PROMPT_TRANSFORMS.build(spec["name"], **options))
        return cls(system=data.system_prompt or "", format=data.format_prompt or "",
                   transforms=tuple(transforms), seed=cfg.train.seed)

    def plain(self) -> "Prompting":
        """The same system turn and format instruction with no transform (eval, SFT, demos)."""
        return dataclasses.replace(self, transforms=())

    def draw(self, step: int) -> Draw:
        """Step `step`'s transforms, drawing from the step's own rng."""
        return Draw(self.transforms, template_rng(self.seed, step))

    def variants(self, example: Example) -> list[Example]:
        """Every prompt the transforms can make of `example`: the length check's candidates."""
        out = [example]
        for transform in self.transforms:
            out = [v for ex in out for v in transform.variants(ex)]
        return out

    def encode(self, policy: Any, examples: list[Example], **options: Any) -> Any:
        """`policy.adapter.encode` of `examples` with this system turn and format instruction
        (`options` go to the adapter as they are, e.g. `tools=`)."""
        return self.encode_with(policy.adapter, policy.processor, examples, **options)

    def encode_with(self, adapter: Any, processor: Any, examples: list[Example],
                    **options: Any) -> Any:
        """`adapter.encode` for an adapter and processor not held by a policy."""
        return adapter.encode(examples, processor, system_prompt=self.system,
                              format_prompt=self.format, **options)

    def messages(self, adapter: Any, example: Example) -> list[dict[str, Any]]:
        """The chat messages `adapter` builds for `example` with this prompting."""
        return adapter.build_messages(example, self.system, self.format)
