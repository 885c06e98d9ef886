"""What the coordinator's Hypothesis state machines share: a throwaway store, catalog and table on
SQLite, a fault switch, and a step that may crash at a named point."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine

from airflow_provider_exactly_once.core.faults import SimulatedCrash
from tests.support.faults import FaultSwitch
from tests.support.pipeline import Pipeline


class PipelineMachine(RuleBasedStateMachine):
    """A state machine over one sink writing table ``ns.t``; ``teardown`` of a subclass checks what
    it must, then calls ``dispose``."""

    sink = "machine"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"eo-{self.sink}-"))
        self.faults = FaultSwitch()
        self.pipeline = self.make_pipeline()
        self.table = "ns.t"
        self.coordinator = self.pipeline.coordinator(self.sink, self.pipeline.iceberg_committer())

    def make_pipeline(self) -> Pipeline:
        """Store and catalog under ``self.tmp``, with the table ``ns.t`` of the test pipeline's schema."""
        (self.tmp / "warehouse").mkdir()
        pipeline = Pipeline(
            meta_url=f"sqlite:///{self.tmp / 'meta.db'}",
            catalog_url=f"sqlite:///{self.tmp / 'catalog.db'}",
            warehouse=self.tmp / "warehouse",
            catalog_name=self.sink,
            namespace="ns",
            fault=self.faults,
        )
        pipeline.create_table("t")
        return pipeline

    def attempt(
        self, crash: str | None, action: Callable[[], object], tolerated: tuple[type[Exception], ...] = ()
    ) -> None:
        """Run ``action`` with a crash armed at ``crash`` (or none); a crash, or a refusal in
        ``tolerated``, is an outcome the machine goes on from."""
        if crash is not None:
            self.faults.crash_at(crash)
        try:
            action()
        except (SimulatedCrash, *tolerated):
            pass
        finally:
            self.faults.disarm()

    def dispose(self) -> None:
        self.pipeline.dispose()
        shutil.rmtree(self.tmp, ignore_errors=True)


def machine_settings(max_examples: int, steps: int) -> settings:
    """No deadline (a step commits to a real catalog); slow examples are what these machines are."""
    return settings(
        max_examples=max_examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
