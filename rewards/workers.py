"""Where a user reward's code runs: daemon worker threads for plain functions, one event loop
for `async def` ones, and, for a call past its timeout, where it is stuck.

Python cannot stop a thread: a call past its timeout keeps its worker and is `outstanding` until
it returns. An async call past its timeout is cancelled instead; only a loop blocked by
synchronous code inside an `async def` leaves a submission outstanding.
"""
from __future__ import annotations

import asyncio
import queue
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

_ASYNCIO = str(Path(asyncio.__file__).parent)

Call = tuple[tuple, dict, int]
"""One call of a user's function: positional args, keyword args, how many completions it scores."""


def _internal(filename: str) -> bool:
    return filename in (__file__, threading.__file__) or filename.startswith(_ASYNCIO)


def _stack(ident: int | None) -> str:
    frame = sys._current_frames().get(ident) if ident else None
    if frame is None:
        return "(the call had not started)"
    frames = [f for f in traceback.extract_stack(frame) if not _internal(f.filename)]
    return "".join(traceback.format_list(frames))


def user_traceback(exc: BaseException) -> str:
    """The traceback from the user's own frame down (our wrapper and asyncio frames dropped)."""
    tb = exc.__traceback__
    while tb is not None and _internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


class _Job:
    __slots__ = ("fn", "args", "kwargs", "done", "status", "value", "thread", "abandoned")

    def __init__(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]):
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.done = threading.Event()
        self.status, self.value, self.thread, self.abandoned = "", None, 0, False


class Pool:
    """Daemon worker threads for one reward, started on demand, gone after a minute idle.

    Python cannot stop a thread, so a call that runs past its timeout keeps its worker; it is
    `outstanding` until it returns (then its worker serves again). Daemon threads never hold up
    the interpreter's exit.
    """

    IDLE_EXIT_S = 60.0

    def __init__(self, name: str):
        self.name = name
        self.outstanding = 0                  # timed-out calls that have not returned yet
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0                        # workers waiting for a job and not yet claimed

    def call(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
             timeout: float) -> tuple[str, Any]:
        """`fn(*args, **kwargs)` on a worker: ("ok", value), ("error", traceback text), or
        ("timeout", where the call is stuck)."""
        job = _Job(fn, args, kwargs)
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                threading.Thread(target=self._work, name=f"reward {self.name}", daemon=True).start()
            self._jobs.put(job)
        if not job.done.wait(timeout):
            with self._lock:
                if not job.done.is_set():
                    job.abandoned = True
                    self.outstanding += 1
                    return "timeout", _stack(job.thread)
        return job.status, job.value

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    if self._idle:   # an unclaimed idle worker may leave: claims stay covered
                        self._idle -= 1
                        return
                continue
            job.thread = threading.get_ident()
            try:
                job.status, job.value = "ok", job.fn(*job.args, **job.kwargs)
            except BaseException as exc:   # noqa: BLE001 -- even SystemExit must not end the worker
                below_us = exc.__traceback__.tb_next   # from the reward's own frame down
                job.status = "error"
                job.value = "".join(traceback.format_exception(type(exc), exc, below_us))
            with self._lock:
                job.done.set()
                if job.abandoned:
                    self.outstanding -= 1
                self._idle += 1


class EventLoop:
    """One asyncio loop on a daemon thread, kept for the reward's life (TRL runs its async
    rewards the same way): clients that bind to a loop (aiohttp, httpx) work across steps."""

    def __init__(self, name: str):
        self.name = name
        self.outstanding = 0       # submissions past their timeout: the loop itself is blocked
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or not self._thread.is_alive():   # a reward stopped it
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                                name=f"reward {self.name} (async)")
                self._thread.start()
            return self._loop

    def run(self, coro: Any) -> Any:
        """The coroutine's result (its exception raised here)."""
        return asyncio.run_coroutine_threadsafe(coro, self._running()).result()

    def submit(self, coro: Any, timeout: float) -> tuple[str, Any]:
        """Like `Pool.call`: ("ok", value), ("error", traceback) or ("timeout", stack)."""
        future = asyncio.run_coroutine_threadsafe(coro, self._running())
        try:
            return "ok", future.result(timeout)
        except TimeoutError:
            with self._lock:
                self.outstanding += 1
            future.add_done_callback(self._returned)   # runs at once if it has just finished
            return "timeout", _stack(self._thread.ident)
        except Exception as exc:   # noqa: BLE001 -- reported like the pool reports it; a
            return "error", user_traceback(exc)   # KeyboardInterrupt here is the user's Ctrl-C

    def _returned(self, _future: Any) -> None:
        with self._lock:
            self.outstanding -= 1


def _coroutine_stack(coro: Any) -> str:
    """Where a suspended coroutine waits: its `await` chain, our frames and asyncio's dropped."""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    summary = traceback.StackSummary.extract(iter(frames))
    return "".join(traceback.format_list([f for f in summary if not _internal(f.filename)]))


async def settle(fn: Callable[..., Any], calls: list[Call],
                 timeout: float | None) -> list[tuple[str, Any]]:
    """Every call of an async `fn` at once, each under `timeout`: (status, value) per call.
    A call past its timeout is cancelled, so it holds nothing up (unlike a thread)."""
    async def one(args: tuple, kwargs: dict[str, Any]) -> tuple[str, Any]:
        try:
            value = fn(*args, **kwargs)
            if asyncio.iscoroutine(value) or asyncio.isfuture(value):
                value = await value
            return "ok", value
        except asyncio.CancelledError:
            raise
        except BaseException as exc:   # noqa: BLE001 -- asyncio re-raises SystemExit and
            return "error", user_traceback(exc)   # KeyboardInterrupt out of the loop: it died

    tasks = [asyncio.ensure_future(one(args, kwargs)) for args, kwargs, _ in calls]
    if not tasks:
        return []
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    out = []
    for task in tasks:
        if task in pending:
            out.append(("timeout", _coroutine_stack(task.get_coro())))
            task.cancel()
        elif task.cancelled():
            out.append(("error", "the call was cancelled (asyncio.CancelledError)"))
        else:
            out.append(task.result())
    return out
