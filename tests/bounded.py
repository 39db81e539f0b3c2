"""Time and memory bounds for the tests of hostile input (issue 10).

``within(seconds)`` interrupts the code it wraps with :class:`Hang` when it
runs longer (a real-time alarm, main thread, POSIX; elsewhere it does not
interrupt and only the elapsed time is checked afterwards).  ``peak_rss_mb``
is the process's peak resident size, to check that a case did not make it
grow.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from typing import Iterator


class Hang(BaseException):
    """Raised in the code under test when it runs past its time bound.

    A BaseException, so that no ``except Exception`` in the code under test
    swallows it."""


def _can_interrupt() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Run the block, raising :class:`Hang` in it if it lasts more than ``seconds``."""
    start = time.monotonic()
    if not _can_interrupt():
        yield
        if time.monotonic() - start > seconds:
            raise Hang(f"took {time.monotonic() - start:.1f} s (bound {seconds} s)")
        return

    def alarm(signum: int, frame: object) -> None:
        # If the exception lands where Python ignores exceptions (a garbage
        # collector callback, a __del__), it is lost: fire again shortly.
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, in MiB (0 if unknown)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024
