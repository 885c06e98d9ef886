"""The provider's metrics on Airflow's StatsD wire: real UDP datagrams from a real epoch run.

The OpenTelemetry wire is checked in ``test_airflow_metrics.py``; this is the other built-in
backend, through the ``statsd`` client Airflow imports. A UDP socket on 127.0.0.1 stands in for the
StatsD daemon and keeps every line it receives. ``Stats`` is initialised from ``[metrics]`` as the
OTLP fixture does (the task runner's ``main()`` does it in each task process; ``dag.test()`` runs
tasks in-process and skips that step).

What plain StatsD gets, read from the installed Airflow (``_shared/observability/metrics/
statsd_logger.py``): ``SafeStatsdLogger`` passes only name, value and rate to ``statsd.StatsClient``,
so tags are dropped unless ``[metrics] statsd_influxdb_enabled`` is on, which appends them to the
name as ``,key=value``. ``statsd_datadog_enabled`` selects DogStatsD instead, whose ``datadog``
package is not in the lock (Airflow then sends nothing), so it is not checked here. Plain StatsD
tells sinks apart only by the legacy names (``exactly_once.commit.rows.<sink_id>``).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from airflow_provider_exactly_once.core.coordinator import write_totals
from airflow_provider_exactly_once.observability.assets import legacy_metric_name
from tests.observability.conftest import run_epoch_then_recover
from tests.support.airflow_world import World

#: ``[metrics] statsd_prefix`` for these tests; every line the provider sends starts with it.
PREFIX = "eo_statsd_test"
#: A line the test sends itself once the run is over: when the receiver has read it, it has read
#: every datagram sent before it (loopback UDP queues a datagram on the receiving socket in sendto).
SENTINEL = b"eo_statsd_test_sentinel:1|c"


class StatsdReceiver:
    """A StatsD daemon's socket: keeps every ``name:value|type`` line of every datagram received."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)  # so the reader thread notices close()
        self.port: int = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._sentinel = threading.Event()
        self._closing = threading.Event()
        # A thread drains the socket as datagrams come: Airflow's own metrics during the run could
        # overflow the kernel's receive buffer if they were left there until the end.
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while not self._closing.is_set():
            try:
                data = self.sock.recv(65_535)
            except TimeoutError:
                continue
            except OSError:
                return
            if data == SENTINEL:
                self._sentinel.set()
                continue
            # The statsd client sends one line per datagram, a pipeline several joined by "\n".
            self.lines.extend(data.decode().splitlines())

    def received(self) -> list[str]:
        """Every line received so far, after making sure none is still in flight."""
        self._sentinel.clear()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as out:
            out.sendto(SENTINEL, ("127.0.0.1", self.port))
        assert self._sentinel.wait(timeout=30), "the StatsD receiver never read the sentinel"
        return list(self.lines)

    def close(self) -> None:
        self._closing.set()
        self.thread.join(timeout=5)
        self.sock.close()


def statsd_receiver(monkeypatch: pytest.MonkeyPatch, *, influxdb: bool) -> Iterator[StatsdReceiver]:
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
    from airflow.sdk.observability.metrics import stats_utils

    receiver = StatsdReceiver()
    for key, value in {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__OTEL_ON": "False",
        "AIRFLOW__METRICS__STATSD_DATADOG_ENABLED": "False",
        "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": str(influxdb),
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(receiver.port),
        "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX,
        "AIRFLOW__METRICS__LEGACY_NAMES_ON": "True",
    }.items():
        monkeypatch.setenv(key, value)
    factory = stats_utils.get_stats_factory()
    # The factory is chosen from [metrics]; a wrong one here would make every assertion below vacuous.
    from airflow.sdk.observability.metrics import statsd_logger

    assert factory is statsd_logger.get_statsd_logger
    stats.initialize(factory=factory, export_legacy_names=True)
    try:
        yield receiver
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=True)
        receiver.close()


@pytest.fixture
def statsd(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdReceiver]:
    yield from statsd_receiver(monkeypatch, influxdb=False)


@pytest.fixture
def statsd_influxdb(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsdReceiver]:
    yield from statsd_receiver(monkeypatch, influxdb=True)


def values(lines: list[str], name: str, kind: str) -> list[float]:
    """The values of every ``<PREFIX>.<name>:<value>|<kind>`` line (exact name: no tags appended)."""
    out = []
    for line in lines:
        stat, _, rest = line.partition(":")
        value, _, stat_kind = rest.partition("|")
        if stat == f"{PREFIX}.{name}" and stat_kind == kind:
            out.append(float(value))
    return out


def test_a_real_epoch_reports_commit_and_pending_metrics_over_statsd(world: World, statsd: StatsdReceiver) -> None:
    run_epoch_then_recover(world, "eo_statsd")

    lines = statsd.received()
    (write_pre,) = world.writes
    files, rows, size = write_totals(write_pre)
    assert rows == 6

    def legacy(name: str) -> str:
        return legacy_metric_name(name, world.sink_id)

    # Plain StatsD has no tags: the sink is in the legacy name, the only per-sink series it gets.
    assert values(lines, legacy("commit.rows"), "c") == [6]
    assert values(lines, legacy("commit.files"), "c") == [files]
    assert values(lines, legacy("commit.bytes"), "c") == [size]
    assert values(lines, legacy("commits"), "c") == [1]  # its outcome tag is dropped on this wire
    (duration,) = values(lines, legacy("commit.duration"), "ms")
    assert duration > 0
    assert values(lines, legacy("pending_epochs"), "g") == [1]
    assert len(values(lines, legacy("oldest_pending_age_seconds"), "g")) == 1
    # The modern names arrive too, as one series for all sinks.
    assert values(lines, "exactly_once.commit.rows", "c") == [6]
    assert values(lines, "exactly_once.pending_epochs", "g") == [1]
    # No line of the provider carries tags: neither InfluxDB's ",k=v" nor DogStatsD's "|#k:v".
    ours = [line for line in lines if line.startswith(f"{PREFIX}.exactly_once.")]
    assert ours
    assert not [line for line in ours if "," in line.partition(":")[0] or "|#" in line]


def test_influxdb_mode_puts_the_tags_in_the_statsd_line(statsd_influxdb: StatsdReceiver) -> None:
    from airflow_provider_exactly_once.observability.assets import AirflowStatsMetrics

    AirflowStatsMetrics().incr("aborts", 2, {"sink_id": "quiet", "outcome": "aborted"})
    AirflowStatsMetrics().gauge("pending_epochs", 3, {"sink_id": "quiet"})

    lines = statsd_influxdb.received()
    assert sorted(lines) == sorted(
        [
            f"{PREFIX}.exactly_once.aborts,sink_id=quiet,outcome=aborted:2|c",
            f"{PREFIX}.{legacy_metric_name('aborts', 'quiet')},outcome=aborted:2|c",
            f"{PREFIX}.exactly_once.pending_epochs,sink_id=quiet:3|g",
            f"{PREFIX}.{legacy_metric_name('pending_epochs', 'quiet')}:3|g",
        ]
    )
