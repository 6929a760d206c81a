"""The one HTTP client every judge, rubric writer and rewriter uses: `POST {url}/chat/completions`
of an OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted API), standard library only.

Errors come as one type with a kind, so each caller maps them to its own failure counting:
`timeout` (no reply within `timeout_s`), `http` (refused, unreachable, an HTTP error status) and
`malformed` (a reply that is not JSON or has no `choices[0].message.content`).
"""
from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

MAX_REPLY_BYTES = 4 << 20
"""A reply longer than this is refused unread past it (a judge's answer is a few hundred bytes)."""


class ChatError(RuntimeError):
    """A chat request that gave no usable reply; `kind` is timeout, http or malformed."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are refused: following one would send the bearer key to wherever it points."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise ChatError("http", f"{req.full_url}: redirected ({code}) to {newurl}; give the "
                                "endpoint's final URL (redirects are not followed, so the API "
                                "key never leaves for another server)")


_OPENER = urllib.request.build_opener(_NoRedirect)


def endpoint_of(url: str) -> str:
    """`url` as the chat-completions endpoint (`.../v1` or the full path both work)."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def chat_completion(url: str, messages: list[dict[str, Any]], *, model: str = "",
                    timeout_s: float = 30.0, max_tokens: int = 1024,
                    api_key_env: str | None = "OPENAI_API_KEY") -> str:
    """The reply text to `messages` at temperature 0; raises `ChatError`.

    `timeout_s` bounds the whole call, connection to last byte (a server that drips its reply
    is cut off at it), not each socket read."""
    endpoint = endpoint_of(url)
    body = json.dumps({"model": model, "messages": messages, "temperature": 0,
                       "max_tokens": max_tokens}).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get(api_key_env, "") if api_key_env else ""
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chat-client")
    try:
        raw = pool.submit(_fetch, request, endpoint, timeout_s).result(timeout=timeout_s)
    except FutureTimeout:
        raise ChatError("timeout", f"{endpoint}: timed out, no reply in {timeout_s:g} s") from None
    finally:
        pool.shutdown(wait=False)          # a dripping server's thread ends at its socket timeout
    try:
        return str(json.loads(raw.decode("utf-8"))["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as err:
        raise ChatError("malformed", f"{endpoint}: unexpected reply {raw[:200]!r}") from err


def _fetch(request: urllib.request.Request, endpoint: str, timeout_s: float) -> bytes:
    """The reply body, read in blocks up to `MAX_REPLY_BYTES`; errors as `ChatError`."""
    deadline = time.monotonic() + timeout_s
    try:
        with _OPENER.open(request, timeout=timeout_s) as reply:
            chunks, size = [], 0
            while block := reply.read(1 << 16):
                chunks.append(block)
                size += len(block)
                if size > MAX_REPLY_BYTES:
                    raise ChatError("malformed", f"{endpoint}: reply over "
                                                 f"{MAX_REPLY_BYTES >> 20} MiB; refused")
                if time.monotonic() > deadline:
                    raise ChatError("timeout", f"{endpoint}: timed out, no reply in {timeout_s:g} s")
            return b"".join(chunks)
    except TimeoutError as err:
        raise ChatError("timeout", f"{endpoint}: timed out, no reply in {timeout_s:g} s") from err
    except urllib.error.URLError as err:
        if isinstance(err.reason, TimeoutError):
            raise ChatError("timeout", f"{endpoint}: timed out, no reply in {timeout_s:g} s") from err
        if isinstance(err.reason, ChatError):
            raise err.reason from None
        raise ChatError("http", f"{endpoint}: {err}") from err
    except (http.client.HTTPException, OSError) as err:      # bad status line, truncated body
        raise ChatError("http", f"{endpoint}: {type(err).__name__}: {err}") from err
