"""Preemption: SIGTERM (what SLURM and Kubernetes send before they kill a job) or SIGINT (Ctrl-C)
during training lets the step under way finish, saves a checkpoint of it and ends the run
cleanly, so `--resume` continues from there. A second SIGINT stops at once, as Ctrl-C does.

Under several processes each rank gets the signal at its own moment (torchrun forwards it): the
ranks ask together after every step (`asked`), so they stop after the same step and save it
together."""
from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any


class Preemption:
    """A context manager holding the run's SIGTERM/SIGINT handlers; `asked(dist)` says whether
    any rank got one (a collective: every rank calls it after every step)."""

    SIGNALS = ("SIGTERM", "SIGINT")

    def __init__(self) -> None:
        self.signal: str | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():    # handlers live there only
            for name in self.SIGNALS:
                num = getattr(signal, name)
                if signal.getsignal(num) is not signal.SIG_IGN:   # nohup'd: keep ignoring it
                    self._old[num] = signal.signal(num, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for num, old in self._old.items():
            signal.signal(num, old)
        self._old.clear()

    def _handle(self, num: int, frame: FrameType | None) -> None:
        name = signal.Signals(num).name
        if self.signal == "SIGINT" and name == "SIGINT":
            raise KeyboardInterrupt                     # a second Ctrl-C: stop now
        self.signal = self.signal or name
        print(f"\n{name} received: finishing this step, then saving a checkpoint and stopping "
              "(Ctrl-C again stops at once)", file=sys.stderr, flush=True)

    def asked(self, dist: Any) -> str | None:
        """The signal any rank received, else None (every rank gets the same answer)."""
        seen = [s for s in dist.gather(self.signal) if s]
        return seen[0] if seen else None
