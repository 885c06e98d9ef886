"""Named fault points.

The coordinator and the committers call ``fault(point)`` right after each step whose completion
changes what recovery must do. Production code passes nothing (a no-op); the crash tests and the
fault-injection harness raise or kill the process at a chosen point, so "a crash after every step"
is a list of names rather than a set of monkeypatches.
"""

from __future__ import annotations

from collections.abc import Callable

FaultHook = Callable[[str], None]


def no_faults(point: str) -> None:
    """The production hook: every step simply continues."""


class SimulatedCrash(BaseException):
    """Raised by test hooks to stop an attempt dead, like a killed process.

    A ``BaseException`` so that no ``except Exception`` on the way up can tidy anything: a real
    crash would not have had the chance either.
    """
