"""``core.observe.Metrics`` on Airflow's ``Stats``: whatever backend ``[metrics]`` configures.

Airflow's task runner initialises ``Stats`` from ``[metrics]`` (``statsd_on``, ``otel_on``,
``statsd_datadog_enabled``) in every task process, so the coordinator's measurements land in the
same StatsD/OpenTelemetry/Datadog pipeline as Airflow's own ``ti.finish`` and ``dagrun.duration``.

Names follow Airflow 3.2+'s own scheme. The modern name carries no variables
(``exactly_once.commit.rows``) and puts ``sink_id`` in the tags; backends without tags (plain
StatsD) would then merge every sink into one series, so while ``[metrics] legacy_names_on`` is true
(Airflow's default) each metric is also emitted under a *legacy* name with the sink in it
(``exactly_once.commit.rows.<sink_id>``), as Airflow does for ``dagrun.duration.success.<dag_id>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from airflow_provider_exactly_once.core.observe import Metrics, safe
from airflow_provider_exactly_once.version_compat import normalize_stat_name, stats

#: Every metric of this provider starts with this.
PREFIX = "exactly_once"


def metric_name(name: str) -> str:
    """The modern (tag-carrying) name of a ``core.observe`` metric."""
    return f"{PREFIX}.{name}"


def legacy_metric_name(name: str, sink_id: str) -> str:
    """The name with the sink in it, for backends without tags.

    A dot inside a sink id would add a level to StatsD's hierarchy, so it becomes ``__`` (Airflow
    does the same to task ids inside task groups); other characters StatsD refuses become ``_``.
    """
    return normalize_stat_name(f"{PREFIX}.{name}.{sink_id.replace('.', '__')}")


class AirflowStatsMetrics:
    """Forwards to Airflow's stats (``version_compat.stats``); see the module docstring for the names.

    :param legacy_names: also emit the sink-in-the-name form; ``None`` reads
        ``[metrics] legacy_names_on`` (default true), as Airflow's own metrics do.
    """

    def __init__(self, *, legacy_names: bool | None = None) -> None:
        if legacy_names is None:
            from airflow_provider_exactly_once.version_compat import conf

            legacy_names = conf.getboolean("metrics", "legacy_names_on", fallback=True)
        self.legacy_names = legacy_names

    def _legacy(self, name: str, tags: Mapping[str, str]) -> tuple[str, dict[str, str]] | None:
        sink_id = tags.get("sink_id")
        if not self.legacy_names or not sink_id:
            return None
        return legacy_metric_name(name, sink_id), {k: v for k, v in tags.items() if k != "sink_id"}

    def incr(self, name: str, count: int, tags: Mapping[str, str]) -> None:
        stats.incr(metric_name(name), count, tags=dict(tags))
        legacy = self._legacy(name, tags)
        if legacy is not None:
            stats.incr(legacy[0], count, tags=legacy[1])

    def gauge(self, name: str, value: float, tags: Mapping[str, str]) -> None:
        stats.gauge(metric_name(name), value, tags=dict(tags))
        legacy = self._legacy(name, tags)
        if legacy is not None:
            stats.gauge(legacy[0], value, tags=legacy[1])

    def timing(self, name: str, duration: timedelta, tags: Mapping[str, str]) -> None:
        stats.timing(metric_name(name), duration, tags=dict(tags))
        legacy = self._legacy(name, tags)
        if legacy is not None:
            stats.timing(legacy[0], duration, tags=legacy[1])


def airflow_metrics() -> Metrics:
    """The provider's metrics for a task process: Airflow's ``Stats``, never raising."""
    return safe(AirflowStatsMetrics())
