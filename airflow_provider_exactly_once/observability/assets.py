"""What a commit tells the rest of Airflow: Asset events for the Iceberg tables an epoch made visible
(``iceberg://<catalog>/<namespace>/<table>``, emitted only on ``COMMITTED``), and the coordinator's
metrics on Airflow's ``Stats``, wherever ``[metrics]`` sends them (docs/observability.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, quote, unquote, urlsplit

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.observability.run_origin import COMMIT_TASK, RunOrigin
from airflow_provider_exactly_once.version_compat import normalize_stat_name, stats

if TYPE_CHECKING:
    from airflow.sdk import Asset, AssetAlias

    from airflow_provider_exactly_once.core.coordinator import Metrics


# Airflow Assets for the Iceberg tables an epoch commits to: ``iceberg://<catalog>/<namespace>/<table>``.
#
# A downstream DAG scheduled on ``iceberg_asset("my_catalog_conn", "analytics.events")`` runs only
# when a commit task made an epoch visible in that table: the commit operator declares an
# ``AssetAlias`` outlet and adds one event per table at run time, and only when the coordinator
# reports ``COMMITTED``. A declared ``Asset`` outlet would not do: Airflow emits an event for every
# declared outlet on every task success, so a rerun that found the epoch already committed (or an
# aborted epoch's skipped commit, were it to succeed) would wake the downstream DAG for data it has
# already seen.
#
# The authority of the URI is the *catalog name*: the Iceberg connection id, which is also the name
# ``IcebergHook`` loads the pyiceberg catalog under. Namespace levels are path segments, so a table
# ``a.b.events`` of catalog ``lake`` is ``iceberg://lake/a/b/events``.

SCHEME = "iceberg"


def iceberg_asset_uri(catalog: str, table: str) -> str:
    """The asset URI of ``table`` (``namespace.table``, dotted) in ``catalog`` (the connection id)."""
    if not isinstance(catalog, str) or not catalog.strip() or "/" in catalog or "@" in catalog:
        raise InvalidSinkConfig(f"iceberg asset: catalog must be a connection id or catalog name, got {catalog!r}")
    if not isinstance(table, str):
        raise InvalidSinkConfig(f"iceberg asset: table must be 'namespace.table', got {table!r}")
    parts = table.split(".")
    if len(parts) < 2 or not all(part.strip() for part in parts):
        raise InvalidSinkConfig(f"iceberg asset: table must be 'namespace.table' (namespace required), got {table!r}")
    return f"{SCHEME}://{quote(catalog, safe='')}/" + "/".join(quote(part, safe="") for part in parts)


def iceberg_asset(catalog: str, table: str, *, extra: Mapping[str, Any] | None = None) -> Asset:
    """The ``Asset`` a commit to ``table`` emits events for: schedule downstream DAGs on it.

    ``catalog`` is the sink's ``iceberg_conn_id``. The asset's name is its URI, as the commit
    operator's events name it, so both refer to one asset.
    """
    from airflow.sdk import Asset

    uri = iceberg_asset_uri(catalog, table)
    return Asset(uri=uri, name=uri, extra=dict(extra or {}))


def create_asset(*, catalog: str, table: str, extra: Mapping[str, Any] | None = None) -> Asset:
    """The ``asset-uris`` factory of the ``iceberg`` scheme (``iceberg_asset`` by keyword)."""
    return iceberg_asset(catalog, table, extra=extra)


def table_of_asset_uri(uri: str) -> tuple[str, str]:
    """``(catalog, "namespace.table")`` of an ``iceberg://`` URI, the inverse of ``iceberg_asset_uri``."""
    parsed = sanitize_uri(urlsplit(uri))
    segments = [unquote(s) for s in parsed.path.strip("/").split("/")]
    return unquote(parsed.netloc), ".".join(segments)


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's URI handler for the ``iceberg`` scheme (``asset-uris`` in the provider info).

    Refuses a URI without a catalog or without ``<namespace>/<table>``, so a typo in a DAG's
    schedule fails at parse time instead of waiting forever for events that name another URI.
    """
    if not uri.netloc:
        raise ValueError(
            f"iceberg asset URI {uri.geturl()!r} has no catalog: use iceberg://<catalog>/<namespace>/<table>"
        )
    segments = [s for s in uri.path.split("/") if s]
    if len(segments) < 2 or len(segments) != len(uri.path.strip("/").split("/")):
        raise ValueError(
            f"iceberg asset URI {uri.geturl()!r} must name <namespace>/<table> after the catalog, without empty levels"
        )
    if uri.query:
        raise ValueError(f"iceberg asset URI {uri.geturl()!r} must not carry a query")
    return uri


def commit_alias(sink_id: str) -> AssetAlias:
    """The alias a sink's commit task declares as its outlet; its events name the tables."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"exactly_once.{sink_id}.committed")


def recovery_alias() -> AssetAlias:
    """The recovery task's outlet: it adds events for the tables of the epochs it committed."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name="exactly_once.recovery.committed")


def committed_asset_events(
    catalog: str,
    tables: Sequence[str],
    *,
    sink_id: str,
    epoch: int,
    write_id: str,
    committed: Mapping[str, str],
    revision: int = 0,
    origin: RunOrigin,
) -> list[tuple[Asset, dict[str, Any]]]:
    """One ``(asset, extra)`` per table of a commit: what a downstream run needs to find its data.

    ``revision`` above 0 says the commit replaced the epoch's earlier data (a reprocess): a
    downstream run must read the epoch again rather than add to what it read before. ``run`` says
    how the committing run came about (``run_origin``), so a scheduled correction, a backfill and a
    cleared run can be told apart."""
    events: list[tuple[Asset, dict[str, Any]]] = []
    for table in tables:
        extra: dict[str, Any] = {
            "sink_id": sink_id,
            "epoch": epoch,
            "write_id": write_id,
            "snapshot_id": committed.get(table),
            "revision": revision,
            "run": origin.model_dump(mode="json"),
        }
        events.append((iceberg_asset(catalog, table), extra))
    return events


def emit_committed(
    context: Mapping[str, Any], alias: AssetAlias, catalog: str, record: Any, *, committed_by: str = COMMIT_TASK
) -> int:
    """Add one asset event per table of a committed epoch to the task's alias outlet; how many.

    ``record`` is the coordinator's ``EpochRecord`` of the epoch, Committed by this task.
    """
    events = committed_asset_events(
        catalog,
        [write.table for write in record.pre_commit.tables],
        sink_id=record.sink_id,
        epoch=record.epoch,
        write_id=record.write_id,
        committed=dict(record.committed or {}),
        revision=record.revision,
        origin=RunOrigin.of(context, committed_by=committed_by),
    )
    accessor = context["outlet_events"][alias]
    for asset, extra in events:
        accessor.add(asset, extra=extra)
    return len(events)


# ``core.coordinator.Metrics`` on Airflow's ``Stats``: whatever backend ``[metrics]`` configures.
#
# Airflow's task runner initialises ``Stats`` from ``[metrics]`` (``statsd_on``, ``otel_on``,
# ``statsd_datadog_enabled``) in every task process, so the coordinator's measurements land in the
# same StatsD/OpenTelemetry/Datadog pipeline as Airflow's own ``ti.finish`` and ``dagrun.duration``.
#
# Names follow Airflow 3.2+'s own scheme. The modern name carries no variables
# (``exactly_once.commit.rows``) and puts ``sink_id`` in the tags; backends without tags (plain
# StatsD) would then merge every sink into one series, so while ``[metrics] legacy_names_on`` is true
# (Airflow's default) each metric is also emitted under a *legacy* name with the sink in it
# (``exactly_once.commit.rows.<sink_id>``), as Airflow does for ``dagrun.duration.success.<dag_id>``.

#: Every metric of this provider starts with this.
PREFIX = "exactly_once"


def metric_name(name: str) -> str:
    """The modern (tag-carrying) name of a ``core.coordinator`` metric."""
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
    # Imported here: a DAG file that names an asset must not load the coordinator's models.
    from airflow_provider_exactly_once.core.coordinator import safe

    return safe(AirflowStatsMetrics())
