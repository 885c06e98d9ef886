"""A coordinator in its own process, for the process-level race tests (spawned, so nothing is shared)."""

from __future__ import annotations

import traceback
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any


def race_commits(config: dict[str, Any], epochs: Queue[int | None], results: Queue[str], barrier: Barrier) -> None:
    from tests.support.pipeline import Pipeline

    pipeline = Pipeline(
        meta_url=config["meta_url"],
        catalog_url=config["catalog_url"],
        warehouse=Path(config["warehouse"]),
        catalog_name=config["catalog_name"],
        namespace=config["namespace"],
    )
    coordinator = pipeline.coordinator(config["sink_id"], pipeline.iceberg_committer())
    try:
        while (epoch := epochs.get()) is not None:
            barrier.wait(timeout=60)
            try:
                results.put(str(coordinator.commit(config["sink_id"], epoch).outcome))
            except Exception as exc:
                results.put(f"error: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    finally:
        pipeline.dispose()
