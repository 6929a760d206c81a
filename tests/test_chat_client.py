"""The one HTTP client of judges and writers (mmrlvr.core.chat_client) against a real local server
that misbehaves the ways servers do: each failure is a `ChatError` of its kind (what the callers
count), never a crash, and the call ends within its timeout however the server drips."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mmrlvr.core.chat_client import ChatError, chat_completion

GOOD = json.dumps({"choices": [{"message": {"content": "step 2"}}]}).encode()
SEEN: list[dict] = []


class Server(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        SEEN.append({"path": self.path, "auth": self.headers.get("Authorization")})
        mode = self.path.split("/")[1]
        if mode == "garbage":                           # not an HTTP status line at all
            self.wfile.write(b"HELLO THERE\r\n\r\n")
            return
        if mode == "redirect":
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/ok/v1")
            self.end_headers()
            return
        body = {"ok": GOOD, "deep": b"[" * 100_000 + b"]" * 100_000,
                "huge": b" " * (6 << 20), "drip": GOOD + b" " * 250, "short": GOOD}[mode]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if mode == "drip":                               # a byte every 0.2 s: each read is quick
            for byte in body:
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.2)
            return
        self.wfile.write(body[:20] if mode == "short" else body)     # short: cut mid-reply


@pytest.fixture(scope="module")
def url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def ask(url: str, mode: str, timeout_s: float = 2.0) -> str:
    return chat_completion(f"{url}/{mode}/v1", [{"role": "user", "content": "hi"}],
                           timeout_s=timeout_s, api_key_env="CHAT_TEST_KEY")


def test_a_good_reply_is_its_content(url):
    assert ask(url, "ok") == "step 2"


@pytest.mark.parametrize("mode, kinds", [("garbage", {"http"}), ("short", {"http", "malformed"}),
                                         ("deep", {"malformed"}), ("huge", {"malformed"})])
def test_a_broken_reply_is_a_chat_error_of_its_kind(url, mode, kinds):
    with pytest.raises(ChatError) as err:
        ask(url, mode)
    assert err.value.kind in kinds, err.value


def test_a_dripping_server_is_cut_off_at_the_timeout_of_the_whole_call(url):
    start = time.monotonic()
    with pytest.raises(ChatError) as err:
        ask(url, "drip", timeout_s=1.0)                  # the reply would take a minute
    # a deadline per read would wait the whole minute (each byte comes quickly); the bound is wide
    # so a busy machine cannot fail it
    assert err.value.kind == "timeout" and time.monotonic() - start < 30


def test_a_redirect_is_refused_and_the_key_goes_nowhere_else(url, monkeypatch):
    monkeypatch.setenv("CHAT_TEST_KEY", "secret")
    SEEN.clear()
    with pytest.raises(ChatError, match="redirected"):
        ask(url, "redirect")
    assert [s["path"] for s in SEEN] == ["/redirect/v1/chat/completions"]
    assert SEEN[0]["auth"] == "Bearer secret"


def test_a_closed_port_is_an_http_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ChatError) as err:
        ask(f"http://127.0.0.1:{port}", "ok")
    assert err.value.kind == "http"
