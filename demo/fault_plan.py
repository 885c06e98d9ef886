"""Faults armed from the environment, for the demo and the fault-injection harness.

``EXACTLY_ONCE_FAULT`` makes every task die at one named point; ``EXACTLY_ONCE_FAULT_PLAN`` names
a file of per-epoch rules, so that faults can be armed under a real scheduler whose workers all
share one environment. The provider never reads either: a task builds its hook from the factory
that ``[exactly_once] fault_hook`` names (``runtime.assembly.configured_fault_hook``), and the demo
and the harness name ``fault_hook_for`` here (``FAULT_HOOK_FACTORY``). Core only knows the hook
(``core.faults``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from airflow_provider_exactly_once.core.faults import FaultHook, SimulatedCrash, no_faults

log = logging.getLogger(__name__)


#: What ``[exactly_once] fault_hook`` (``runtime.assembly.FAULT_HOOK_ENV_VAR``) is set to for a
#: task to read the two variables below.
FAULT_HOOK_FACTORY = f"{__name__}:fault_hook_for"
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
    changing any DAG. Known points: ``persist.staged`` (an append's manifest written, its row not yet),
    ``persist.inserted``, ``persist.replaced``, ``commit.decided``,
    ``commit.visible``, ``commit.marked``, ``abort.marked``, ``abort.cleaned``, ``cleanup.deleted``
    (coordinator); ``batch.decided``, ``batch.visible``, ``batch.marked`` (recovery's batched
    commit, ``core.coordinator``); ``iceberg.loaded``, ``iceberg.before_catalog_update``,
    ``iceberg.after_catalog_update`` (Iceberg committer), and between those two on a SQL catalog's
    fan-out ``iceberg.metadata_written`` (every table's metadata file written) and
    ``iceberg.in_catalog_transaction`` (every pointer moved, not yet committed); ``files.before_move``,
    ``files.after_move`` (file sink committer).
    """
    text = environ.get(FAULT_ENV_VAR, "").strip()
    if not text:
        return no_faults
    return EnvFaultHook(FaultSpec.parse(text))


# -- per-epoch fault plans ---------------------------------------------------------------------------

#: The environment variable naming a fault-plan file (JSON list of rules, see ``load_fault_plan``).
FAULT_PLAN_ENV_VAR = "EXACTLY_ONCE_FAULT_PLAN"
PlanMode = Literal["crash", "kill", "pause"]
_PLAN_KEYS = {"sink", "epoch", "point", "occurrence", "try", "mode", "seconds"}
_POINT = re.compile(r"^[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+$")


@dataclass(frozen=True)
class PlannedFault:
    """One rule of a fault plan: in the task try ``try_number`` (any try when ``None``) of the epoch
    ``epoch`` of sink ``sink``, at the ``occurrence``-th time ``point`` is reached, crash, kill, or
    pause for ``seconds`` and go on (a slowed attempt, so that a second one can run beside it)."""

    sink: str
    epoch: int
    point: str
    occurrence: int = 1
    try_number: int | None = None
    mode: PlanMode = "crash"
    seconds: float = 0.0

    def applies_to(self, sink_id: str, epoch: int | None, try_number: int | None) -> bool:
        if self.sink != sink_id or self.epoch != epoch:
            return False
        return self.try_number is None or self.try_number == try_number


def load_fault_plan(path: str | os.PathLike[str]) -> list[PlannedFault]:
    """Read a fault plan: ``[{"sink", "epoch", "point", "occurrence"?, "try"?, "mode"?, "seconds"?}]``.

    Read when each task try builds its coordinator, so a harness may rewrite the file between runs.
    Anything malformed is refused with the file and the rule named: a plan that silently injects
    nothing would "prove" whatever the run was meant to test.
    """
    import json

    where = f"{FAULT_PLAN_ENV_VAR}={os.fspath(path)}"
    try:
        with open(path, encoding="utf-8") as stream:
            raw = json.load(stream)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{where}: cannot read the fault plan: {exc}") from None
    if not isinstance(raw, list):
        raise ValueError(f"{where}: a fault plan is a JSON list of rules, got {type(raw).__name__}")
    rules: list[PlannedFault] = []
    for n, item in enumerate(raw):
        rules.append(_plan_rule(item, f"{where}, rule {n}"))
    return rules


def _plan_rule(item: object, where: str) -> PlannedFault:
    if not isinstance(item, dict):
        raise ValueError(f"{where}: a rule is a JSON object, got {type(item).__name__}")
    unknown = set(item) - _PLAN_KEYS
    missing = {"sink", "epoch", "point"} - set(item)
    if unknown or missing:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}, missing keys {sorted(missing)}")
    sink, epoch, point = item["sink"], item["epoch"], item["point"]
    occurrence, try_number = item.get("occurrence", 1), item.get("try")
    mode, seconds = item.get("mode", "crash"), item.get("seconds", 0)
    if not isinstance(sink, str) or not sink:
        raise ValueError(f"{where}: 'sink' must be a sink id, got {sink!r}")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"{where}: 'epoch' must be a non-negative integer, got {epoch!r}")
    if not isinstance(point, str) or not _POINT.match(point):
        raise ValueError(f"{where}: 'point' must be a fault point such as 'commit.visible', got {point!r}")
    if not isinstance(occurrence, int) or isinstance(occurrence, bool) or occurrence < 1:
        raise ValueError(f"{where}: 'occurrence' must be an integer >= 1, got {occurrence!r}")
    if try_number is not None and (not isinstance(try_number, int) or isinstance(try_number, bool) or try_number < 1):
        raise ValueError(f"{where}: 'try' must be an integer >= 1 or absent, got {try_number!r}")
    if mode not in ("crash", "kill", "pause"):
        raise ValueError(f"{where}: 'mode' must be crash, kill or pause, got {mode!r}")
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        raise ValueError(f"{where}: 'seconds' must be a non-negative number, got {seconds!r}")
    if mode == "pause" and seconds == 0:
        raise ValueError(f"{where}: a 'pause' rule needs 'seconds' > 0")
    return PlannedFault(sink, epoch, point, occurrence, try_number, mode, float(seconds))


class PlanFaultHook:
    """The hook of one task try under a fault plan: the plan's rules for its (sink, epoch, try), and
    the ``EXACTLY_ONCE_FAULT`` hook as well when that is set. Counts points like ``EnvFaultHook``."""

    def __init__(self, rules: list[PlannedFault], env_hook: FaultHook = no_faults) -> None:
        self.rules = rules
        self.env_hook = env_hook
        self.seen: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, point: str) -> None:
        with self._lock:
            self.seen[point] += 1
            count = self.seen[point]
        for rule in self.rules:
            if rule.point != point or rule.occurrence != count:
                continue
            log.warning("%s: %s at %s (#%d) for %s", FAULT_PLAN_ENV_VAR, rule.mode, point, count, rule)
            if rule.mode == "pause":
                import time

                time.sleep(rule.seconds)
                continue
            if rule.mode == "kill":
                for handler in logging.getLogger().handlers:
                    handler.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            raise SimulatedCrash(f"{FAULT_PLAN_ENV_VAR}: simulated crash at {point} (#{count})")
        self.env_hook(point)


def fault_hook_for(
    sink_id: str, epoch: int | None, try_number: int | None, environ: Mapping[str, str] = os.environ
) -> FaultHook:
    """The fault hook of one task try of one epoch: ``EXACTLY_ONCE_FAULT`` (every task) plus the rules
    of the plan file named by ``EXACTLY_ONCE_FAULT_PLAN`` that match this sink, epoch and try.

    Without a plan this is exactly ``fault_hook_from_env``; with one, per-epoch faults can be armed
    under a real scheduler, whose workers all share one environment.
    """
    env_hook = fault_hook_from_env(environ)
    plan = environ.get(FAULT_PLAN_ENV_VAR, "").strip()
    if not plan:
        return env_hook
    rules = [r for r in load_fault_plan(plan) if r.applies_to(sink_id, epoch, try_number)]
    if not rules:
        return env_hook
    return PlanFaultHook(rules, env_hook)
