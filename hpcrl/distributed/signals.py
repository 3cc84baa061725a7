"""The scheduler's warning signal, turned into a flag that the job's loop checks at a safe point."""

from __future__ import annotations

import signal
from typing import Any


class StopFlag:
    """Set by SIGUSR1 (the job script forwards the scheduler's warning as USR1), SIGTERM or SIGINT."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None
