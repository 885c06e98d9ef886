"""How a registered sink's epochs reach their tables (``core.delivery``), for the epoch views.

Only a fan-out's answer needs its catalog (a REST catalog's ``/v1/config``, or its connection's
``exactly-once.multi-table-commit``), opened as the sink's committer would open it. An epoch view
must not fail for it: a catalog that cannot be opened is ``unknown`` with the reason, masked.
The UI's process lives long and opens a page per click, so an answer is kept ``TTL_S`` seconds per
sink (as registered: a changed registration is asked again); the sinks list and ``eo-sink status``
never ask, so listing many sinks opens no catalog.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

from airflow_provider_exactly_once.core.delivery import FILE_SINK, SINGLE_TABLE, EpochDelivery, unknown
from airflow_provider_exactly_once.core.errors import ExactlyOnceError
from airflow_provider_exactly_once.runtime.assembly import iceberg_catalog, reaching
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, SinkConfig

#: How long a fan-out's answer is kept: a connection changed by hand shows within a minute.
TTL_S = 60.0


def delivery_of(sink: SinkConfig) -> EpochDelivery:
    """The sink's answer, its catalog opened only for a fan-out (pyiceberg is imported only then)."""
    if isinstance(sink, FileSinkConfig):
        return FILE_SINK
    if len(sink.tables) == 1:
        return SINGLE_TABLE
    from airflow_provider_exactly_once.sinks.iceberg.table_transactions import TableTransactions

    try:
        with reaching(sink):
            catalog = iceberg_catalog(sink)
    except ExactlyOnceError as exc:
        return unknown(len(sink.tables), exc)
    return TableTransactions(catalog).delivery(len(sink.tables))


class Deliveries:
    """Each sink's answer, kept ``ttl_s`` seconds; threads may ask at once (the UI's handlers run in
    a pool), and none waits for another's catalog."""

    def __init__(
        self,
        ttl_s: float = TTL_S,
        *,
        find: Callable[[SinkConfig], EpochDelivery] = delivery_of,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._find = find
        self._clock = clock
        #: Per sink id: its registration as asked about, when, and the answer.
        self._kept: dict[str, tuple[str, float, EpochDelivery]] = {}
        self._lock = threading.Lock()

    def of(self, sink: SinkConfig) -> EpochDelivery:
        registration = json.dumps(sink.model_dump(mode="json"), sort_keys=True, default=str)
        now = self._clock()
        with self._lock:
            kept = self._kept.get(sink.sink_id)
        if kept is not None and kept[0] == registration and now - kept[1] < self._ttl_s:
            return kept[2]
        found = self._find(sink)
        with self._lock:
            self._kept[sink.sink_id] = (registration, now, found)
        return found
