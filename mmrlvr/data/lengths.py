"""Prompt lengths checked when a split loads: a row whose prompt (its text, the run's system and
format prompts, the longest of `data.templates`, and the tokens its images, clips and videos
become) is longer than the model's context or `data.max_prompt_tokens` is a bad row, named by
file and row (`data.on_error: skip` drops it and records it in `skipped_rows.jsonl`). A
million-character prompt once passed load and the first rollout tried to allocate 250 GB.

Checking must stay cheap on a big split, so a row is measured in up to three steps and stops at
the first that decides it:

1. bytes, no tokenizer: a token covers at least one byte of the text after the tokenizer's
   normaliser, and NFC (Qwen's) at most triples a text's UTF-8 size, so `EXPANSION` × the
   row's UTF-8 bytes + the template's own tokens + an upper bound per medium bounds the prompt.
   A row within the limit by that bound is kept untokenised (nearly every row of a real set);
2. the text tokenised through the chat template, each medium one placeholder: a lower bound
   of the prompt (a placeholder becomes at least one token). Over the limit: refused; within
   it with every medium at its upper bound: kept;
3. the row encoded as a rollout encodes it (`adapter.encode`): the exact length, media and
   all. Only rows near the limit with media get here.

The budget itself (the limit, the bounds, the tokenizer and the encoder) comes from the model
(`mmrlvr.train.lengths.prompt_budget`): this module sees callables only, so the data layer
imports no model family.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mmrlvr.data.rows import DataError, Example

EXPANSION = 4
"""Tokens one UTF-8 byte of text may become at most (NFC at most triples a text's bytes, each
token covers at least one byte; 4 leaves room for a template's seams)."""


@dataclass(frozen=True)
class PromptBudget:
    """The longest prompt a row may have, and how to measure one (see the module doc)."""

    limit: int
    """Tokens a prompt may have: the smaller of the model's context and data.max_prompt_tokens."""
    why: str
    """What the limit is, for the error: "the model's context of 4,096 tokens (...)"."""
    overhead: int
    """Tokens of the prompt around an empty question: the chat template with the run's system
    and format prompts, measured, and a margin for the seams."""
    text_bytes: Callable[[Example], int]
    """The UTF-8 bytes of a row's own text (its question, its system turn where the run sets
    none, the longest template)."""
    media_bound: Callable[[Example], int | None]
    """An upper bound of the tokens the row's media become (None: no bound for one of them)."""
    text_tokens: Callable[[Example], int]
    """Step 2: the prompt tokenised with each medium as one placeholder (the longest template)."""
    exact_tokens: Callable[[Example], int]
    """Step 3: the prompt as a rollout encodes it (needs the row's media)."""

    def problem(self, example: Example, exact: bool = True) -> str | None:
        """Why `example`'s prompt is too long (or cannot be built at all), or None.
        `exact=False` (a lazy split's scan, whose media are not read yet) decides only by steps
        1 and 2 and keeps the rows they leave open: those are measured when drawn."""
        try:
            return self._problem(example, exact)
        except DataError as err:        # the adapter cannot build its prompt: a rollout would fail
            return err.reason or str(err)

    def _problem(self, example: Example, exact: bool) -> str | None:
        media = self.media_bound(example)
        if media is not None and \
                EXPANSION * self.text_bytes(example) + self.overhead + media <= self.limit:
            return None
        text, has_media = self.text_tokens(example), _has_media(example)
        if text > self.limit:
            return self._too_long(f"at least {text:,} tokens before its media are counted"
                                  if has_media else f"{text:,} tokens", has_media)
        if media is not None and text + media <= self.limit:
            return None
        if not exact:
            return None
        n = self.exact_tokens(example)
        return self._too_long(f"{n:,} tokens with its media", True) if n > self.limit else None

    def _too_long(self, size: str, media: bool) -> str:
        fix = "shorten the question (or the run's system/format prompt)"
        return f"the prompt is {size}, over {self.why}; {fix}" + \
            (", or give the row fewer or smaller media" if media else "")


def _has_media(example: Example) -> bool:
    return bool(example.images or example.audios or example.videos)
