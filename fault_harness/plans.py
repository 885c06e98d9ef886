"""What a fault scenario is, as data: one pipeline, the fault-plan rules its epochs get, and the
actions the harness itself takes while its runs go.

A ``Scenario`` is one pipeline (its own DAG, sink, table and landed hours); its ``rules`` are read
by every task try through ``EXACTLY_ONCE_FAULT_PLAN`` (by epoch index); its ``actions`` run in
threads beside the runs, each given a ``Context`` (``fault_harness.actions`` and
``fault_harness.reprocessing`` make them). ``describe_plan`` is what a report records of a plan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fault_harness.cluster import ICEBERG_CONN_ID, Cluster
from fault_harness.harness import Harness, Pipeline
from fault_harness.layout import WRITE_POINT

#: Every action gives up after this long; a scenario that cannot reach its fault is a failure. Long:
#: on a loaded machine a pipeline's sensor may start many minutes after the DAG was parsed.
ACTION_TIMEOUT_S = 1500.0


@dataclass(frozen=True)
class Rule:
    """A fault-plan rule for the scenario's epoch number ``epoch`` (0-based)."""

    epoch: int
    point: str
    mode: str = "kill"
    try_number: int | None = 1
    occurrence: int = 1
    seconds: float = 0.0


@dataclass
class Context:
    harness: Harness
    pipeline: Pipeline
    log: list[str]
    #: Set once every pipeline's runs have finished the first time.
    settled: threading.Event
    #: ``time.monotonic()`` by which the whole run must have ended (the driver's own timeout).
    deadline: float = float("inf")

    @property
    def cluster(self) -> Cluster:
        return self.harness.cluster

    def note(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")


Action = Callable[[Context], None]


@dataclass
class Scenario:
    name: str
    epochs: int = 2
    writer: str = "light"
    #: Seconds each row of a Spark write takes on the executors (``slow_input``): a window for an
    #: action to kill the Spark under the write. 0: the hour's files as they are.
    write_pause_s: float = 0.0
    sensor: str = "poke"
    failed_hours: frozenset[int] = frozenset()
    late_hours: frozenset[int] = frozenset()
    rules: tuple[Rule, ...] = ()
    actions: tuple[Action, ...] = ()
    #: Actions run after every scenario's runs finished (then the runs are awaited again).
    after: tuple[Action, ...] = ()
    description: str = ""
    max_active_runs: int = 3
    #: The Iceberg connection of the pipeline's DAG (``stacks.PROXIED_ICEBERG_CONN_ID``: through the proxy).
    conn_id: str = ICEBERG_CONN_ID
    #: ``append`` (the example pipeline), ``upsert`` (``upsert_pipeline``: changes by key, judged
    #: against a key model by ``upsert_checker``; one run at a time) or ``incremental``
    #: (``incremental_pipeline``: an upstream Iceberg table read by snapshot ranges while the
    #: harness's producer appends to it, judged by ``incremental_checker``; one run at a time; its
    #: ``failed_hours`` are epochs whose write crashes on every try, so that the run aborts them).
    mode: str = "append"
    #: The pipeline's tables: more than one is a fan-out, each epoch the same rows into every table,
    #: committed in one catalog transaction where the catalog takes it (the production stack's does).
    tables: int = 1
    #: Write, audit, publish (design.md D23): the epoch group gets ``audit=`` a check that fails for
    #: the ``bad_hours`` (``pipeline.bad_hours_check``), so those epochs must never reach ``main``.
    audited: bool = False
    #: An audited pipeline's checkpointed hours whose audit fails: each stays Pending, off ``main``.
    bad_hours: frozenset[int] = frozenset()
    pipeline: Pipeline | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in ("append", "upsert", "incremental"):
            raise ValueError(f"scenario {self.name}: mode is append, upsert or incremental, not {self.mode!r}")
        if self.mode in ("upsert", "incremental") and self.max_active_runs != 1:
            raise ValueError(
                f"scenario {self.name}: an {self.mode} pipeline runs one epoch at a time (max_active_runs=1)"
            )
        if self.mode == "incremental":
            if self.writer not in ("light", "spark") or self.late_hours:
                raise ValueError(f"scenario {self.name}: an incremental pipeline writes light or spark, no late hours")
            if self.epochs < 3:
                # The producer stops once the third-to-last run ended (``incremental.produce_upstream``).
                raise ValueError(f"scenario {self.name}: an incremental pipeline runs at least 3 epochs")
            # A failed hour is an epoch whose write crashes on every try: its run fails into its abort.
            self.rules = (
                *self.rules,
                *(Rule(n, WRITE_POINT, mode="crash", try_number=None) for n in sorted(self.failed_hours)),
            )
        if self.tables > 1 and (self.mode != "append" or self.writer != "light"):
            raise ValueError(f"scenario {self.name}: a fan-out pipeline is an append with the light writer")
        if self.audited and (self.mode != "append" or self.tables > 1):
            raise ValueError(f"scenario {self.name}: an audited pipeline is an append to one table")
        if self.bad_hours and (not self.audited or self.bad_hours & self.failed_hours):
            raise ValueError(f"scenario {self.name}: bad hours are an audited pipeline's checkpointed hours")
        if self.write_pause_s and self.writer == "light":
            raise ValueError(f"scenario {self.name}: write_pause_s slows a Spark write; the light writer has none")


def describe_plan(scenarios: Sequence[Scenario]) -> list[dict[str, Any]]:
    return [
        {
            "name": s.name,
            "description": s.description,
            "mode": s.mode,
            "tables": s.tables,
            **({"audited": True, "bad_hours": sorted(s.bad_hours)} if s.audited else {}),
            "epochs": s.epochs,
            "writer": s.writer,
            "write_pause_s": s.write_pause_s,
            "sensor": s.sensor,
            "failed_hours": sorted(s.failed_hours),
            "late_hours": sorted(s.late_hours),
            "rules": [r.__dict__ for r in s.rules],
            "actions": (["produce_upstream"] if s.mode == "incremental" else [])
            + [getattr(a, "__qualname__", repr(a)).split(".<locals>")[0] for a in (*s.actions, *s.after)],
        }
        for s in scenarios
    ]


def wait_for(ctx: Context, what: str, predicate: Callable[[], Any], timeout: float = ACTION_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{ctx.pipeline.name}: {what} did not happen within {timeout:.0f} s")
