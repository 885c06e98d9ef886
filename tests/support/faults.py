"""A fault hook for tests: crash (raise ``SimulatedCrash``) at the n-th time a named point is reached."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from airflow_provider_exactly_once.core.faults import SimulatedCrash


class FaultSwitch:
    """Counts every fault point reached and crashes at the one it is armed for.

    ``then`` runs an action at a point instead of crashing (another writer committing, say), once.
    """

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self._armed: tuple[str, int] | None = None
        self._actions: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def crash_at(self, point: str, occurrence: int = 1) -> None:
        self._armed = (point, self.seen[point] + occurrence)

    def then(self, point: str, action: Callable[[], None]) -> None:
        self._actions[point] = action

    def disarm(self) -> None:
        self._armed = None
        self._actions.clear()

    def __call__(self, point: str) -> None:
        with self._lock:
            self.seen[point] += 1
            count = self.seen[point]
            action = self._actions.pop(point, None)
            crash = self._armed is not None and self._armed == (point, count)
            if crash:
                self._armed = None
        if action is not None:
            action()
        if crash:
            raise SimulatedCrash(f"simulated crash at {point} (#{count})")
