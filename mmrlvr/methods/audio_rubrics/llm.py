"""The language-model calls behind the LLM rubric judge and the rubric writer.

`complete(messages) -> reply text` comes from an OpenAI-compatible HTTP endpoint
(`http_completion`: `POST {url}/chat/completions`) or a local transformers model
(`hf_completion`); `ask_json` sends one prompt, reads the first JSON object of the reply, hands
it to a strict parser, and retries (with backoff) while the call fails or the parser rejects the
reply. Every failure is a `JudgeError`.
"""
from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from mmrlvr.core.chat_client import ChatError, chat_completion
from mmrlvr.methods.audio_rubrics.checks import JudgeError

Complete = Callable[[list[dict[str, str]]], str]


def parse_json(text: str) -> dict[str, Any]:
    """The first JSON object in a reply (code fences and surrounding prose allowed)."""
    text = re.sub(r"```(?:json)?", "", text or "")
    start = text.find("{")
    while start != -1:
        depth = 0
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                try:
                    out = json.loads(text[start:i + 1])
                    if isinstance(out, dict):
                        return out
                except json.JSONDecodeError:
                    pass
                break
        start = text.find("{", start + 1)
    raise JudgeError(f"the reply holds no JSON object: {text[:200]!r}")


def ask_json(complete: Complete, system: str, prompt: str, parse: Callable[[dict[str, Any]], Any],
             *, retries: int, backoff_s: float, who: str) -> Any:
    """`parse(first JSON object of the reply)`, asking again up to `retries` times on failure."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    last: Exception | None = None
    for attempt in range(retries + 1):
        try:
            return parse(parse_json(complete(messages)))
        except (JudgeError, OSError, ValueError, KeyError, TypeError) as err:
            last = err
            if attempt < retries:
                time.sleep(backoff_s * 2 ** attempt)
    raise JudgeError(f"{who} failed after {retries + 1} tries: {last}")


def http_completion(url: str, model: str = "", timeout_s: float = 30.0, max_tokens: int = 1024,
                    api_key_env: str = "OPENAI_API_KEY") -> Complete:
    """`complete(messages)` against an OpenAI-compatible chat endpoint (`.../v1` or the full path)."""
    def complete(messages: list[dict[str, str]]) -> str:
        try:
            return chat_completion(url, messages, model=model, timeout_s=timeout_s,
                                   max_tokens=max_tokens, api_key_env=api_key_env)
        except ChatError as err:
            raise JudgeError(str(err)) from None

    return complete


def _load_lm(model: str, dtype: Any) -> Any:
    """A causal LM, else the class the checkpoint's config names (an audio or vision-language
    model such as Qwen2-Audio generates text from text alone too)."""
    import transformers

    try:
        return transformers.AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
    except ValueError:
        names = transformers.AutoConfig.from_pretrained(model).architectures or []
        cls = next((getattr(transformers, n) for n in names if hasattr(transformers, n)), None)
        if cls is None:
            raise JudgeError(f"{model}: neither a causal LM nor a transformers class in its "
                             f"config's architectures {names}") from None
        return cls.from_pretrained(model, dtype=dtype)


def hf_completion(model: str, timeout_s: float = 60.0, max_new_tokens: int = 1024,
                  device: str = "auto") -> Complete:
    """`complete(messages)` with a local transformers model (loaded on first use, greedy)."""
    state: dict[str, Any] = {}

    def complete(messages: list[dict[str, str]]) -> str:
        import torch
        from transformers import AutoTokenizer

        if not state:
            dev = "cuda" if device == "auto" and torch.cuda.is_available() else \
                ("cpu" if device == "auto" else device)
            state["tok"] = AutoTokenizer.from_pretrained(model)
            state["model"] = _load_lm(
                model, torch.bfloat16 if dev.startswith("cuda") else torch.float32).to(dev).eval()
        tok, lm = state["tok"], state["model"]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True).to(lm.device)
        try:
            with torch.no_grad():
                out = lm.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                                  max_time=timeout_s)
        except (RuntimeError, IndexError) as err:   # e.g. a prompt past the model's context
            raise JudgeError(f"local model {model}: {type(err).__name__}: {err}") from None
        return tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)

    return complete


def make_completion(spec: dict[str, Any], who: str) -> tuple[Complete, int]:
    """`(complete, retries)` from `{kind: http, url, model?, timeout_s?, max_tokens?, retries?}` or
    `{kind: hf, model, timeout_s?, max_new_tokens?, device?, retries?}`; `who` names the option
    in errors."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    retries = int(spec.pop("retries", 2))
    if kind == "http":
        if not spec.get("url"):
            raise ValueError(f"{who} kind http needs a 'url' (an OpenAI-compatible endpoint)")
        return http_completion(**spec), retries
    if kind == "hf":
        if not spec.get("model"):
            raise ValueError(f"{who} kind hf needs a 'model' (a local dir or hub id)")
        return hf_completion(**spec), retries
    raise ValueError(f"unknown {who} kind {kind!r}; choose http or hf")


__all__ = ["Complete", "ask_json", "hf_completion", "http_completion", "make_completion",
           "parse_json"]
