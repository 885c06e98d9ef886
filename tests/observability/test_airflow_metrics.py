"""The provider's metrics through Airflow's own ``Stats`` in a real epoch run (``dag.test()``).

This is the OpenTelemetry wire: OTLP/HTTP protobuf exported to a receiver this test runs on
127.0.0.1 (the StatsD wire is ``test_statsd_metrics.py``). ``Stats`` is initialised from ``[metrics]`` exactly as the task runner's ``main()`` does
in every task process (``dag.test()`` runs tasks in-process and skips that step).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from airflow_provider_exactly_once.observability.assets import legacy_metric_name
from tests.observability.conftest import run_epoch_then_recover
from tests.support.airflow_world import World


class OtlpReceiver:
    """A minimal OTLP/HTTP metrics endpoint: keeps every decoded ``ExportMetricsServiceRequest``."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        requests: list[Any] = []
        self.requests = requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                message = ExportMetricsServiceRequest()
                message.ParseFromString(body)
                requests.append((self.path, message))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def points(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """metric name -> (attributes, value) of every data point received (sums, gauges, histogram sums)."""
        out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
        for path, request in self.requests:
            assert path == "/v1/metrics"
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            attrs = {kv.key: kv.value.string_value for kv in point.attributes}
                            if kind in ("histogram", "exponential_histogram"):
                                value = point.sum
                            else:
                                value = point.as_double if point.HasField("as_double") else point.as_int
                            out[metric.name].append((attrs, float(value)))
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    from airflow.sdk._shared.observability.metrics import stats
    from airflow.sdk.observability.metrics import stats_utils

    receiver = OtlpReceiver()
    for key, value in {
        "AIRFLOW__METRICS__OTEL_ON": "True",
        "AIRFLOW__METRICS__STATSD_ON": "False",
        "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__OTEL_PORT": str(receiver.port),
        "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "600000",  # exported by the flush below
        "AIRFLOW__METRICS__LEGACY_NAMES_ON": "True",
    }.items():
        monkeypatch.setenv(key, value)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=True)
    yield receiver
    from opentelemetry import metrics

    provider: Any = metrics.get_meter_provider()
    provider.shutdown(timeout_millis=10_000)  # its last export goes to the receiver, still listening
    # The OTel backend registered an exit-time flush of the provider just shut down; it would only
    # log "already shutdown" into pytest's closed streams.
    import atexit

    from airflow.sdk._shared.observability.metrics import otel_logger

    atexit.unregister(otel_logger.flush_otel_metrics)
    stats.initialize(factory=lambda: stats_utils.NoStatsLogger(), export_legacy_names=True)
    receiver.close()


def flush() -> None:
    from opentelemetry import metrics

    provider: Any = metrics.get_meter_provider()
    provider.force_flush(timeout_millis=10_000)


def total(points: dict[str, list[tuple[dict[str, str], float]]], name: str, **attrs: str) -> float:
    return sum(value for labels, value in points.get(name, []) if attrs.items() <= labels.items())


def test_a_real_epoch_reports_commit_and_pending_metrics_over_otlp(world: World, otlp: OtlpReceiver) -> None:
    run_epoch_then_recover(world, "eo_metrics")
    flush()

    points = otlp.points()
    (write_pre,) = world.writes
    sink_tag = {"sink_id": world.sink_id}
    files = len(write_pre.tables[0].data_files)
    # Modern names carry the sink as an attribute; OTel prefixes every Airflow metric with "airflow.".
    assert total(points, "airflow.exactly_once.commit.rows", **sink_tag) == 6
    assert total(points, "airflow.exactly_once.commit.files", **sink_tag) == files
    assert total(points, "airflow.exactly_once.commits", outcome="committed", **sink_tag) == 1
    assert total(points, "airflow.exactly_once.commit.duration", **sink_tag) > 0
    assert total(points, "airflow.exactly_once.pending_epochs", **sink_tag) == 1
    assert "airflow.exactly_once.oldest_pending_age_seconds" in points
    # Legacy names carry it in the name, for backends without tags.
    assert total(points, "airflow." + legacy_metric_name("commit.rows", world.sink_id)) == 6
    assert total(points, "airflow." + legacy_metric_name("pending_epochs", world.sink_id)) == 1


def test_legacy_names_keep_the_sink_one_level_of_the_statsd_hierarchy() -> None:
    from airflow_provider_exactly_once.observability.assets import metric_name

    assert metric_name("commit.rows") == "exactly_once.commit.rows"
    assert legacy_metric_name("commit.rows", "orders") == "exactly_once.commit.rows.orders"
    assert legacy_metric_name("commit.rows", "eu.orders-v2") == "exactly_once.commit.rows.eu__orders-v2"


def test_without_legacy_names_only_the_tagged_name_is_sent(otlp: OtlpReceiver) -> None:
    from airflow_provider_exactly_once.observability.assets import AirflowStatsMetrics

    AirflowStatsMetrics(legacy_names=False).incr("aborts", 2, {"sink_id": "quiet", "outcome": "aborted"})
    flush()

    points = otlp.points()
    assert points["airflow.exactly_once.aborts"] == [({"sink_id": "quiet", "outcome": "aborted"}, 2.0)]
    assert not [name for name in points if name.endswith(".quiet")]
