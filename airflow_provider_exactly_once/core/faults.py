"""Named fault points.

The coordinator and the committers call ``fault(point)`` right after each step whose completion
changes what recovery must do. Production code passes nothing (a no-op); the crash tests and the
fault-injection harness raise or kill the process at a chosen point, so "a crash after every step"
is a list of names rather than a set of monkeypatches.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

FaultHook = Callable[[str], None]

log = logging.getLogger(__name__)


def no_faults(point: str) -> None:
    """The production hook: every step simply continues."""


class SimulatedCrash(BaseException):
    """Raised by test hooks to stop an attempt dead, like a killed process.

    A ``BaseException`` so that no ``except Exception`` on the way up can tidy anything: a real
    crash would not have had the chance either.
    """


#: The environment variable ``fault_hook_from_env`` reads: ``<point>[@<occurrence>][:crash|:kill]``.
FAULT_ENV_VAR = "EXACTLY_ONCE_FAULT"
FaultMode = Literal["crash", "kill"]
_SPEC = re.compile(
    r"^(?P<point>[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+)(?:@(?P<occurrence>[1-9][0-9]*))?(?::(?P<mode>crash|kill))?$"
)


@dataclass(frozen=True)
class FaultSpec:
    """One armed fault: stop at the ``occurrence``-th time ``point`` is reached, by ``mode``."""

    point: str
    occurrence: int = 1
    mode: FaultMode = "crash"

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Read ``<point>[@<occurrence>][:crash|:kill]``; a malformed value is refused, never ignored,
        because a fault run that silently injects nothing would "prove" whatever it was meant to test."""
        match = _SPEC.match(text.strip())
        if match is None:
            raise ValueError(
                f"{FAULT_ENV_VAR}={text!r} is not '<point>[@<occurrence>][:crash|:kill]', "
                "e.g. 'commit.visible', 'commit.decided@2:kill'"
            )
        mode: FaultMode = "kill" if match["mode"] == "kill" else "crash"
        return cls(match["point"], int(match["occurrence"] or 1), mode)


class EnvFaultHook:
    """The hook ``fault_hook_from_env`` returns when a fault is armed.

    It counts the points it sees, so ``@2`` means "the second time this hook reaches the point":
    one hook is built per coordinator (one per task try), so the count is per try. ``crash`` raises
    ``SimulatedCrash`` (the task fails as if its process had died, and Airflow may retry it); ``kill``
    sends SIGKILL to this very process, which is what a lost worker looks like: nothing after the
    point runs, not even ``finally`` blocks or Airflow's failure handling.
    """

    def __init__(self, spec: FaultSpec) -> None:
        self.spec = spec
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, point: str) -> None:
        with self._lock:
            self.seen[point] += 1
            hit = point == self.spec.point and self.seen[point] == self.spec.occurrence
        if not hit:
            return
        log.warning(
            "%s=%s: stopping at %s (#%d) by %s", FAULT_ENV_VAR, self.spec, point, self.seen[point], self.spec.mode
        )
        if self.spec.mode == "kill":
            for handler in logging.getLogger().handlers:  # let the line above reach the task log
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedCrash(f"{FAULT_ENV_VAR}: simulated crash at {point} (#{self.seen[point]})")


def fault_hook_from_env(environ: Mapping[str, str] = os.environ) -> FaultHook:
    """The fault hook named by ``EXACTLY_ONCE_FAULT``, or ``no_faults`` when it is unset or empty.

    For the demo and the fault-injection harness: they make one task die at a named point (for
    example ``commit.visible``, after the Iceberg commit and before the Committed mark) without
    changing any DAG. Known points: ``persist.inserted``, ``persist.replaced``, ``commit.decided``,
    ``commit.visible``, ``commit.marked``, ``abort.marked``, ``abort.cleaned``, ``cleanup.deleted``
    (coordinator); ``iceberg.loaded``, ``iceberg.before_catalog_update``,
    ``iceberg.after_catalog_update`` (Iceberg committer); ``files.before_move``, ``files.after_move``
    (file sink committer).
    """
    text = environ.get(FAULT_ENV_VAR, "").strip()
    if not text:
        return no_faults
    return EnvFaultHook(FaultSpec.parse(text))
