"""One prompt, streamed token by token; a completion split into its reasoning and final answer.

Generation is transformers `generate` in a thread, with the media placeholder tokens suppressed
exactly as the `hf` rollout engine does. `TextIteratorStreamer` holds text back until a word
ends (a space), so a model that writes `<think>…` without spaces showed its whole answer at once;
`TokenStreamer` hands over every token, and the reader decodes all tokens so far each time (the
replacement character of a multi-byte character cut short waits for the next token).
"""
from __future__ import annotations

import queue
import re
import threading
from collections.abc import Iterator
from typing import Any

import torch

from mmrlvr.core.prompting import Prompting
from mmrlvr.core.types import to_device
from mmrlvr.data import Example
from rewards.verify import extract_answer

STREAM_TIMEOUT_S = 600.0
"""Longest wait for the next token before the stream gives up (a hung generate thread)."""
_THINK = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|\Z)", re.DOTALL)
_END = object()


class TokenStreamer:
    """A `generate` streamer that passes each new token id on at once (batch of one)."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Any] = queue.Queue()
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:           # generate's first call carries the prompt
            self.prompt_seen = True
            return
        self.queue.put(value.reshape(-1).tolist())

    def end(self) -> None:
        self.queue.put(_END)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            item = self.queue.get(timeout=STREAM_TIMEOUT_S)
            if item is _END:
                return
            yield item


class _Stop:
    """Stopping criterion that ends generation when the reader goes away (tab closed, new ask)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **_: Any) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool,
                          device=input_ids.device)


def stream_completion(policy: Any, example: Example, *, sample: bool, temperature: float,
                      max_new_tokens: int, prompting: Prompting = Prompting()
                      ) -> Iterator[tuple[str, int]]:
    """Yield (completion text so far, tokens generated) after every token (one prompt, any
    adapter). The prompt goes through the adapter's `encode` and `generation_inputs` as in the
    `hf` rollout engine (the audio adapter encodes the clip once and hands `generate` its
    `inputs_embeds`). Closing the iterator stops generation."""
    from transformers import StoppingCriteriaList

    batch = prompting.encode(policy, [example])
    inputs = to_device(batch.inputs, policy.device, policy.dtype)
    streamer, stop = TokenStreamer(), _Stop()
    kwargs = {"max_new_tokens": int(max_new_tokens), "eos_token_id": policy.eos_ids,
              "pad_token_id": policy.pad_id, "suppress_tokens": policy.placeholder_ids,
              "streamer": streamer, "stopping_criteria": StoppingCriteriaList([stop])}
    if sample:
        kwargs.update(do_sample=True, temperature=float(temperature), top_p=1.0, top_k=None)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            with torch.no_grad():
                policy.model.generate(**inputs, **kwargs)
        except BaseException as err:  # noqa: BLE001 — re-raised in the reader below
            failure.append(err)
            streamer.end()

    was_training = policy.model.training
    policy.model.eval()
    try:
        with torch.no_grad():
            inputs = policy.adapter.generation_inputs(policy.base_model(), batch, inputs)
    except BaseException:
        policy.model.train(was_training)
        raise
    thread = threading.Thread(target=run, name="demo-generate", daemon=True)
    thread.start()
    ids: list[int] = []
    n_tokens, eos = 0, set(policy.eos_ids)
    try:
        for new in streamer:
            n_tokens += len(new)
            ids += [t for t in new if t not in eos]
            text = policy.tokenizer.decode(ids, skip_special_tokens=True)
            yield text.removesuffix("\ufffd"), n_tokens
        if ids:
            yield policy.tokenizer.decode(ids, skip_special_tokens=True), n_tokens
    finally:
        stop.event.set()
        thread.join()
        policy.model.train(was_training)
    if failure:
        raise failure[0]


def split_completion(text: str) -> tuple[str, str]:
    """(reasoning, final answer) of a completion, either one possibly still being written.

    The reasoning is the `<think>` block (or, without tags, the text before the answer); the
    answer is the `<answer>` block, else what `rewards.verify.extract_answer` finds.
    """
    think, ans = _THINK.search(text), _ANSWER.search(text)
    answer = ans.group(1).strip() if ans else (extract_answer(text) or "")
    if think:
        reasoning = think.group(1).strip()
    else:
        reasoning = (text[:ans.start()] if ans else text).strip()
    return reasoning, answer
