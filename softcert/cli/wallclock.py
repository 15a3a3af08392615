"""Wall-clock budgets of the solver commands (``softcert vnnlib verify``, ``softcert vnncomp``).

A harness times the whole process: interpreter start-up, imports, loading and solving. So
the clock starts with the process (``seconds_since_start``), the solver gets what is left
less ``MARGIN``, and a ``Watchdog`` thread gives the timeout answer at the deadline if the
solver has not answered by then (a bound computation cannot always stop in between; the
thread gets the interpreter lock because torch releases it in its kernels). Only the
``softcert`` process itself (``standalone``) runs the watchdog: called in-process through
``softcert.cli.main``, the clock starts with the call and nothing ends the caller's process.
"""
from __future__ import annotations

import os
import sys
import threading
import time

_IMPORTED = time.monotonic()

#: seconds kept back from the solver for writing its answer and ending the process (the
#: measured answer-to-exit time after ``os._exit`` is below 0.05 s; tests/test_vnnlib_interface.py)
MARGIN = 0.1


def seconds_since_start() -> float:
    """Seconds since this process started (Linux: its start time in /proc, so interpreter
    start-up and imports count), else since this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.monotonic() - _IMPORTED


def deadline_of(timeout: float, standalone: bool) -> float:
    """The ``time.monotonic()`` deadline of a budget of ``timeout`` seconds: counted from the
    process start for the ``softcert`` process, from now for an in-process call."""
    return time.monotonic() - (seconds_since_start() if standalone else 0.0) + timeout


class Watchdog:
    """Calls ``answer()`` (which writes the timeout answer) and ends the process at
    ``deadline`` (a ``time.monotonic()`` value) unless ``claim()`` came first; ``claim()`` is
    True when the answer is the caller's to give."""

    def __init__(self, deadline: float, answer):
        self.lock, self.settled, self.answer = threading.Lock(), False, answer
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self):
        with self.lock:
            if self.settled:
                return
            self.settled = True
            try:
                self.answer()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)

    def claim(self) -> bool:
        with self.lock:
            mine, self.settled = not self.settled, True
        self.timer.cancel()
        return mine

    def cancel(self):
        self.timer.cancel()


def standalone(names=("softcert", "softcert-vnnlib")) -> bool:
    """Is this process the ``softcert`` command itself (its console scripts ``names`` or
    ``python -m softcert``), not a Python program calling softcert.cli.main?"""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return os.path.basename(sys.argv[0] or "") in names or getattr(spec, "name", "") == "softcert.__main__"


def finish(rc: int) -> None:
    """End the standalone process now that the answer is out, rather than after the
    interpreter's teardown of torch and onnxruntime (0.5-0.7 s measured after a
    branch-and-bound run), which a harness would count against the timeout."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
