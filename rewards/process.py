"""A user reward in a process of its own: `isolation: process` in its spec.

A thread shares the trainer's fate: a reward that calls `os._exit`, segfaults in a C extension,
never returns or leaks memory takes the run with it (or piles up threads). In a process of its
own each of these ends only that process: the call it was making scores the failure value and is
counted (`error`; `timeout` when the process is killed at `timeout_s`, so nothing is left
running), and a new process serves the next call. `memory_mb` caps what the reward may allocate
beyond what loading it took (`RLIMIT_DATA`): past it an allocation raises MemoryError, counted as
an error, and the process restarts to give the memory back.

The workers fork from a zygote: a fresh interpreter (`ZYGOTE`; none of the trainer's threads,
locks or CUDA state, and no re-run of the trainer's script) started when the rewards are built,
so its imports (torch: seconds) overlap the model's load and a restart costs a fork (~17 ms).
Each worker builds the reward from its spec with `rewards.get`, as `build_combined` did
(`rewards.base.rebuild`); a reward object's state lives in the worker and starts over when it
restarts, and examples and results cross by pickle, so the reward works on copies. Ctrl-C
(which a terminal sends to the whole process group) and SIGTERM (which SLURM sends to every
process) are the trainer's to act on: the zygote ignores both, a worker ignores Ctrl-C and ends
after its call under way on SIGTERM. The zygote exits when the trainer closes its pipe or is
gone, and its workers die with it (PR_SET_PDEATHSIG). Calls run on the worker's main thread, so
signal-based timeouts (math_verify's default) work there. Linux only (prctl, RLIMIT_DATA, /proc).

What it costs per call, to start and to restart: `bench/reward_isolation.py`.
"""
from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import weakref
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from pathlib import Path
from typing import Any, Callable

from rewards.workers import Call, settle

START_S = 180.0
"""How long a new worker may take to import and build its reward (torch, on a busy machine)."""

ZYGOTE = "import sys; from rewards.process import zygote; zygote(int(sys.argv[1]))"
"""The zygote's command (not `-m rewards.process`: the `rewards` package imports this module
first, and runpy would then run a second copy of it)."""

PR_SET_PDEATHSIG = 1   # prctl(2): the signal a process gets when its parent dies


class Worker:
    """One reward's worker process. `run(calls, timeout_s, is_async)` gives each call's
    (status, value) as `Pool.call` does; a worker that died or was killed is replaced at the
    next call.

    Workers are forked from a zygote (`ZYGOTE`, started here) that has done
    the imports once, so a restart costs a fork and the reward's own build, not torch's import.
    """

    outstanding = 0     # a call past its timeout is killed with its process, never left running

    def __init__(self, name: str, build: Callable[[], tuple[Callable[..., Any], bool]],
                 memory_mb: float | None = None):
        """`build`: picklable, called in each worker: the function to call and whether it is
        async (`rewards.base.rebuild` of the reward's spec). `memory_mb`: the worker's cap."""
        if memory_mb is not None and (isinstance(memory_mb, bool)
                                      or not isinstance(memory_mb, (int, float))
                                      or not 0 < memory_mb < math.inf):
            raise ValueError(f"reward {name}: memory_mb must be a positive number of MB, got "
                             f"{memory_mb!r}")
        self.name, self.build, self.memory_mb = name, build, memory_mb
        self.starts = 0                 # workers forked: 1 + the restarts
        self.broken: str | None = None  # the reward cannot be built in a worker: calls fail
        self._zygote: subprocess.Popen | None = None
        self._ctl: Connection | None = None
        self._pid: int | None = None    # the worker's pid (the zygote's child, not ours)
        self._conn: Connection | None = None
        fd, stack = tempfile.mkstemp(prefix="mmrlvr-reward-", suffix=".stack")
        os.close(fd)
        self._stack = Path(stack)       # the worker's faulthandler writes its stack here
        self._finalizer = weakref.finalize(self, _stop, None, self._stack)
        self._start_zygote()

    def _start_zygote(self) -> None:
        ours, theirs = Pipe()
        self._zygote = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),))
        theirs.close()
        ours.send(sys.path)                  # first: `build` unpickles by importing its module
        ours.send((self.build, self.memory_mb, str(self._stack)))
        self._ctl = ours
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _stop, self._zygote, self._stack)

    def close(self) -> None:
        """End the zygote and its worker (also done when the reward is collected or at exit)."""
        self._finalizer()

    def run(self, calls: list[Call], timeout_s: float, is_async: bool) -> list[tuple[str, Any]]:
        """Each call's (status, value): one at a time under `timeout_s`, or all at once (an
        `async def`: each under `timeout_s` inside the worker's event loop)."""
        if not is_async:
            return [self._ask(("call", (args, kwargs)), timeout_s) for args, kwargs, _ in calls]
        status, value = self._ask(("settle", (calls, timeout_s)),
                                  timeout_s + min(timeout_s, 5.0))
        return value if status == "ok" else [(status, value)] * len(calls)

    def _ask(self, message: tuple[str, Any], timeout_s: float) -> tuple[str, Any]:
        if self.broken:
            return "error", self.broken
        try:
            if self._pid is None:
                failure = self._fork()
                if failure:
                    return "error", failure
            self._conn.send(message)
            if not self._conn.poll(timeout_s):
                return "timeout", self._kill_stuck()
            status, value, exiting = self._conn.recv()
        except (EOFError, OSError):
            return "error", self._died()
        except BaseException:        # Ctrl-C, or a message pickle cannot carry: no stale reply
            self._kill()
            raise
        if exiting:                  # over its memory cap, or asked to stop: it is ending
            self._kill()
        return status, value

    def _fork(self) -> str | None:
        """A new worker, ready; else why not."""
        if self._zygote.poll() is not None:            # killed (the OOM killer?): a new one
            self._start_zygote()
        try:
            self._ctl.send(("fork", None))
            if not self._ctl.poll(START_S):
                return f"the reward's process did not start within {START_S:g} s"
            self._pid = self._ctl.recv()
            self._conn = Connection(recv_handle(self._ctl))
        except (EOFError, OSError) as exc:
            return f"the reward's zygote process failed ({type(exc).__name__}: {exc})"
        self.starts += 1
        if not self._conn.poll(START_S):
            self._kill()
            return f"the reward's process did not build the reward within {START_S:g} s"
        status, value, _ = self._conn.recv()
        if status != "ready":        # builds in the trainer, not in a fresh interpreter
            self.broken = f"the reward could not be built in its own process:\n{value}"
            self._kill()
            return self.broken
        return None

    def _died(self) -> str:
        code = self._kill()
        if code is not None and code < 0:
            how = f"killed by {signal.Signals(-code).name}"
            if -code == signal.SIGKILL:
                how += "; the kernel's out-of-memory killer sends SIGKILL"
        else:
            how = f"exit code {code}"
        return (f"the reward's process died during the call ({how}); a new one starts for the "
                "next call")

    def _kill_stuck(self) -> str:
        """Where the stuck call is (the worker's faulthandler dump); then the worker killed."""
        try:
            os.kill(self._pid, signal.SIGUSR1)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline and " in " not in self._read_stack():
                time.sleep(0.02)
            time.sleep(0.05)                      # the rest of the dump
            stack = self._read_stack()
        finally:
            self._kill()
        frames = [line for line in stack.splitlines() if line.strip().startswith("File")
                  and not any(ours in line for ours in (__file__, "threading.py", "<string>"))]
        where = "\n".join(frames) if frames else "(no stack from the process)"
        return (f"{where}\n(most recent call first; the reward's process was killed and a new "
                "one starts for the next call)")

    def _read_stack(self) -> str:
        try:
            return self._stack.read_text(errors="replace")
        except OSError:
            return ""

    def _kill(self) -> int | None:
        """The worker killed (if still running) and reaped by the zygote: its exit code."""
        if self._pid is None:
            return None
        pid, self._pid = self._pid, None
        self._conn.close()
        try:
            os.kill(pid, signal.SIGKILL)  # not reaped yet, so the pid is still the worker's
        except ProcessLookupError:        # the zygote died and the worker went with it
            return None
        try:
            self._ctl.send(("wait", pid))
            return self._ctl.recv()
        except (EOFError, OSError):
            return None


def _stop(zygote: subprocess.Popen | None, stack: Path) -> None:
    """The zygote killed (its workers die with it: PR_SET_PDEATHSIG), the stack file removed."""
    if zygote is not None and zygote.poll() is None:
        zygote.kill()
        zygote.wait()
    stack.unlink(missing_ok=True)


def _data_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmData:\s+(\d+) kB", status).group(1)) * 1024


def zygote(fd: int) -> None:
    """Import once, then fork a worker per request ("fork") and reap it ("wait"): until the
    trainer closes the pipe (or is gone), then exit; the workers die with the zygote."""
    ctl = Connection(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the trainer's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # SLURM signals every process: the trainer
    sys.path[:] = ctl.recv()                        # decides, and closes the pipe at its exit
    setup = ctl.recv()     # unpickling `build` imports what every worker needs (torch), once
    while True:
        try:
            what, pid = ctl.recv()
        except (EOFError, OSError):
            os._exit(0)
        if what == "wait":
            ctl.send(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            continue
        ours, theirs = Pipe()
        pid = os.fork()
        if pid == 0:
            ctl.close()
            ours.close()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            try:
                serve(theirs, *setup)
            except BaseException:   # noqa: BLE001 -- ours: said, and the trainer sees it die
                traceback.print_exc()
                os._exit(1)
            os._exit(0)
        theirs.close()
        ctl.send(pid)
        send_handle(ctl, ours.fileno(), os.getppid())
        ours.close()


def serve(conn: Connection, build: Callable[[], tuple[Callable[..., Any], bool]],
          memory_mb: float | None, stack: str) -> None:
    """A worker: build the reward, then answer calls until the pipe closes."""
    zygote_pid = os.getppid()
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != zygote_pid:          # it died before prctl took hold
        os._exit(0)
    state = {"busy": False, "stop": False}

    def on_term(num: int, frame: Any) -> None:
        if not state["busy"]:
            os._exit(0)
        state["stop"] = True                     # after the call under way

    signal.signal(signal.SIGTERM, on_term)
    stack_file = open(stack, "w")                # noqa: SIM115 -- faulthandler keeps it open
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        fn, is_async = build()
    except BaseException:   # noqa: BLE001 -- told to the trainer, which fails every call with it
        conn.send(("failed", traceback.format_exc(), True))
        return
    if memory_mb is not None:
        cap = _data_bytes() + int(memory_mb * 2**20)
        resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    loop = asyncio.new_event_loop() if is_async else None
    conn.send(("ready", None, False))
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        state["busy"], over = True, False
        if kind == "settle":
            calls, timeout_s = payload
            status, value = "ok", loop.run_until_complete(settle(fn, calls, timeout_s))
        else:
            args, kwargs = payload
            try:
                status, value = "ok", fn(*args, **kwargs)
            except BaseException as exc:   # noqa: BLE001 -- SystemExit too: a counted error
                over = isinstance(exc, MemoryError) and memory_mb is not None
                below_us = exc.__traceback__.tb_next
                status = "error"
                value = "".join(traceback.format_exception(type(exc), exc, below_us))
                if over:
                    value += (f"(the reward's process is over memory_mb={memory_mb:g} and "
                              "restarts to give the memory back)\n")
        exiting = over or state["stop"]
        try:
            conn.send((status, value, exiting))
        except Exception as exc:   # noqa: BLE001 -- a value pickle cannot carry
            conn.send(("error", ("the reward returned a value its process cannot send back: "
                                 f"{type(exc).__name__}: {exc}"), exiting))
        state["busy"] = False
        if exiting:
            return

