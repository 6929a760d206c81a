"""The one HTTP client every judge, rubric writer and rewriter uses: `POST {url}/chat/completions`
of an OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted API), standard library only.

Errors come as one type with a kind, so each caller maps them to its own failure counting:
`timeout` (no reply within `timeout_s`), `http` (refused, unreachable, an HTTP error status) and
`malformed` (a reply that is not JSON or has no `choices[0].message.content`).
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any


class ChatError(RuntimeError):
    """A chat request that gave no usable reply; `kind` is timeout, http or malformed."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def endpoint_of(url: str) -> str:
    """`url` as the chat-completions endpoint (`.../v1` or the full path both work)."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def chat_completion(url: str, messages: list[dict[str, Any]], *, model: str = "",
                    timeout_s: float = 30.0, max_tokens: int = 1024,
                    api_key_env: str | None = "OPENAI_API_KEY") -> str:
    """The reply text to `messages` at temperature 0; raises `ChatError`."""
    endpoint = endpoint_of(url)
    body = json.dumps({"model": model, "messages": messages, "temperature": 0,
                       "max_tokens": max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            raw = reply.read()
    except TimeoutError as err:
        raise ChatError("timeout", f"{endpoint}: timed out, no reply in {timeout_s:g} s") from err
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise ChatError("timeout", f"{endpoint}: timed out, no reply in {timeout_s:g} s") from err
        raise ChatError("http", f"{endpoint}: {err}") from err
    except OSError as err:
        raise ChatError("http", f"{endpoint}: {err}") from err
    try:
        return str(json.loads(raw.decode("utf-8"))["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ChatError("malformed", f"{endpoint}: unexpected reply {raw[:200]!r}") from err
