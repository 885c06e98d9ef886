"""The coordinator of one sink, assembled from connections: what every task, the recovery DAG
and the operations tools build before they ask the coordinator anything.

Hooks hold connections only; this puts the meta store, the sink's committer, the checkpoint source,
the fault hook (``configured_fault_hook``) and Airflow's metrics together once, the same way for
everyone, rebuilds a registered sink from its registry row and explains one that cannot be opened
(``reaching``, ``unreachable``). The map: design.md, "Layers"; the registry: D5.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_exactly_once.checkpoints.config import (
    CheckpointConfig,
    MetaStoreCheckpoint,
    checkpoint_config_from_dict,
)
from airflow_provider_exactly_once.core.errors import (
    ExactlyOnceError,
    InvalidSinkConfig,
    SinkUnavailable,
    mask_userinfo,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.defaults import CONFIG_SECTION, DEFAULT_META_CONN_ID
from airflow_provider_exactly_once.runtime.run_epochs import epoch_for_context, interval_epoch
from airflow_provider_exactly_once.sinks.config import IcebergSinkConfig, SinkConfig, sink_config_from_dict

if TYPE_CHECKING:
    from airflow_provider_exactly_once.checkpoints.sources import CheckpointTable
    from airflow_provider_exactly_once.core.cleanups import WriteFolderListing
    from airflow_provider_exactly_once.core.coordinator import Metrics, TwoPhaseCommitCoordinator
    from airflow_provider_exactly_once.core.ports import CheckpointSource, SinkCommitter, SinkRegistry
    from airflow_provider_exactly_once.store import SqlSinkStateStore


#: ``[exactly_once] meta_conn_id``: the meta store of every task that names none.
META_CONN_ID_OPTION = "meta_conn_id"
#: ``[exactly_once] full_file_check_after_seconds``: how long after its persist an epoch's commit checks
#: only the write's own manifests before its decision (``core.coordinator.FULL_FILE_CHECK_AFTER``).
FULL_FILE_CHECK_OPTION = "full_file_check_after_seconds"
#: ``[exactly_once] fault_hook``: ``module:callable`` naming a ``FaultHookFactory``; unset in production.
FAULT_HOOK_OPTION = "fault_hook"
#: The same option as Airflow reads it from the environment.
FAULT_HOOK_ENV_VAR = f"AIRFLOW__{CONFIG_SECTION.upper()}__{FAULT_HOOK_OPTION.upper()}"
#: Builds the fault hook of one task try: ``(sink_id, epoch, try_number) -> FaultHook``.
FaultHookFactory = Callable[[str, int | None, int | None], FaultHook]


#: The longest duration an ``[exactly_once]`` option takes: a century, beyond any real setting and
#: well inside what a date holds (a retention or a grace is subtracted from now).
LONGEST_CONFIGURED_DURATION = timedelta(days=36_500)


def configured_duration(
    option: str, default: timedelta, unit: Literal["seconds", "days"], *, zero_allowed: bool = False
) -> timedelta:
    """``[exactly_once] <option>``, a number of ``unit`` (``default`` when unset): finite, above 0
    (or 0 when ``zero_allowed``) and at most a century; anything else is one ``ValueError`` line
    naming the option, its environment variable and what it takes, never a bare ``OverflowError``."""
    from airflow_provider_exactly_once.version_compat import conf

    raw = conf.get(CONFIG_SECTION, option, fallback=None)
    if raw is None:
        return default
    text = str(raw).strip()
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    longest = LONGEST_CONFIGURED_DURATION / timedelta(**{unit: 1})
    if math.isfinite(value) and (value > 0 or (zero_allowed and value == 0)) and value <= longest:
        return timedelta(**{unit: value})
    lowest = "from 0" if zero_allowed else "above 0"
    raise ValueError(
        f"[{CONFIG_SECTION}] {option} (AIRFLOW__{CONFIG_SECTION.upper()}__{option.upper()}) = {text[:40]!r} is "
        f"refused: give a number of {unit} {lowest} up to {longest:.0f} (a century)"
    )


def configured_fault_hook(sink_id: str, epoch: int | None, try_number: int | None) -> FaultHook:
    """The fault hook of one task try: ``no_faults`` unless ``[exactly_once] fault_hook`` names a
    factory, which is then imported and asked for this try's hook.

    A plug point, so that fault injection (the demo, the fault harness, a user's own chaos tests)
    lives outside the package: with the option unset a task imports and reads nothing about faults.
    A value that does not name an importable callable fails the task, naming the option: a fault
    run that silently injects nothing would "prove" whatever it was meant to test.
    """
    from airflow_provider_exactly_once.version_compat import conf

    value = str(conf.get(CONFIG_SECTION, FAULT_HOOK_OPTION, fallback="") or "").strip()
    if not value:
        return no_faults
    return load_fault_hook_factory(value)(sink_id, epoch, try_number)


def load_fault_hook_factory(value: str) -> FaultHookFactory:
    """The callable ``module:attribute`` names, or a ``ValueError`` naming the option and the fix."""
    where = f"[{CONFIG_SECTION}] {FAULT_HOOK_OPTION} ({FAULT_HOOK_ENV_VAR}) = {value!r}"
    module_name, _, attribute = value.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{where} is not 'module:callable', e.g. 'demo.fault_plan:fault_hook_for'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{where}: cannot import {module_name!r} ({exc}); put it on the task's sys.path or unset the option"
        ) from exc
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ValueError(f"{where}: {module_name!r} has no callable {attribute!r}")
    return factory  # type: ignore[no-any-return]


def as_sink(sink: SinkConfig | Mapping[str, Any]) -> SinkConfig:
    """Accept a sink config or its ``model_dump(mode="json")`` form (what a DAG built from JSON has)."""
    return sink if not isinstance(sink, Mapping) else sink_config_from_dict(sink)


def as_checkpoint(checkpoint: CheckpointConfig | Mapping[str, Any]) -> CheckpointConfig:
    return checkpoint if not isinstance(checkpoint, Mapping) else checkpoint_config_from_dict(checkpoint)


def checkpoint_source(checkpoint: CheckpointConfig | None, table: CheckpointTable) -> CheckpointSource:
    """The checkpoint's source (the meta store's checkpoint table when there is none), with its
    storage connection read now."""
    config = checkpoint or MetaStoreCheckpoint()
    if isinstance(config, MetaStoreCheckpoint):
        return config.source(table)
    from airflow_provider_exactly_once.hooks.storage import resolved_storage_options  # brings Airflow's SDK

    return config.source(table, storage_options=resolved_storage_options(config))


def sink_committer(sink: SinkConfig, *, fault: FaultHook = no_faults, metrics: Metrics | None = None) -> SinkCommitter:
    """The committer of a sink, its Iceberg catalog built from the sink's Iceberg connection.

    ``fault`` is the fault-injection hook (``core.faults``); production passes none. ``metrics``:
    none by default (``core.coordinator`` is imported here, not where DAG files import this module).
    """
    if metrics is None:
        from airflow_provider_exactly_once.core.coordinator import NO_METRICS

        metrics = NO_METRICS

    if isinstance(sink, IcebergSinkConfig):
        committer = sink.committer(iceberg_catalog(sink), fault=fault)
        committer.metrics = metrics  # its conflict retries (``core.coordinator.COMMIT_RETRIES``)
        return committer
    from airflow_provider_exactly_once.hooks.storage import resolved_storage_options  # brings Airflow's SDK

    return sink.committer(fault=fault, storage_options=resolved_storage_options(sink))


def iceberg_catalog(sink: IcebergSinkConfig) -> Any:
    """The sink's catalog, from its Iceberg connection; one that cannot be loaded is ``SinkUnavailable``."""
    from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

    from airflow_provider_exactly_once.sinks.iceberg.catalog_access import UNREACHABLE, describe_error

    hook = IcebergHook(sink.iceberg_conn_id)
    try:
        catalog = hook.catalog
    except UNREACHABLE as exc:
        # A REST catalog is contacted as it is loaded: down, it must read "try again" like any
        # other unreachable catalog call, not as an unknown failure (its connection's secrets masked).
        conn = hook.get_connection(sink.iceberg_conn_id)
        extra = conn.extra_dejson or {}
        properties = {**extra, "password": conn.password or ""}
        uri = conn.host or extra.get("uri")  # the host wins, as in IcebergHook
        where = f"catalog of connection {sink.iceberg_conn_id!r}" + (f" ({uri})" if uri else "")
        what = mask_userinfo(f"sink {sink.sink_id!r}: {where} could not be loaded")
        raise SinkUnavailable(f"{what}: {describe_error(exc, properties)}") from exc
    from airflow_provider_exactly_once.hooks.meta_store import configure_catalog_mappers

    configure_catalog_mappers(catalog)
    return catalog


@dataclass(frozen=True)
class OpenedSink:
    """A registered sink opened once: what recovery and ``eo-sink gc`` ask about its storage.

    The committer and the write-folder listing share one catalog or file system, so an orphan
    scan lists with the credentials the deletes use, and a sink is opened once per action.
    """

    sink: SinkConfig
    committer: SinkCommitter
    write_folders: WriteFolderListing
    #: The hook of the committer, for every clean-up run with it.
    fault: FaultHook

    @property
    def sink_id(self) -> str:
        return self.sink.sink_id


def open_sink(
    sink: SinkConfig,
    *,
    fault: FaultHook | None = None,
    metrics: Metrics | None = None,
) -> OpenedSink:
    """The sink's committer, and the write-folder listing its config hands out on the committer's
    own catalog or file system (``sinks.write_locations``, imported only then: it brings pyarrow's
    filesystems, which a parse of the recovery DAG's file never needs).

    ``fault`` defaults to ``configured_fault_hook``, as for ``coordinator_for``.
    """
    if fault is None:
        fault = configured_fault_hook(sink.sink_id, None, None)
    committer = sink_committer(sink, fault=fault, metrics=metrics)
    return OpenedSink(sink, committer, sink.write_folders(committer), fault)


def coordinator_for(
    sink: SinkConfig,
    checkpoint: CheckpointConfig | None,
    *,
    meta_conn_id: str = DEFAULT_META_CONN_ID,
    store: SqlSinkStateStore | None = None,
    fault: FaultHook | None = None,
    epoch: int | None = None,
    try_number: int | None = None,
    metrics: Metrics | None = None,
    allow_beyond_horizon: bool = False,
    committer: SinkCommitter | None = None,
) -> TwoPhaseCommitCoordinator:
    """The coordinator of one sink: the meta store of ``meta_conn_id`` (or ``store``), the sink's
    committer (``committer``: one opened already, with ``fault``), and the checkpoint source (``None`` only for steps that never consult it, such as
    persist; the meta-store checkpoint table then stands in).

    ``fault`` defaults to ``configured_fault_hook``: a no-op unless ``[exactly_once] fault_hook``
    names a factory, which lets the demo and the fault-injection harness make a real task die at a
    named point without touching the DAG. One hook serves the coordinator and the committer, so an
    occurrence count (``commit.visible@2``) counts every place the point is reached in this task try.
    ``epoch`` and ``try_number`` (the task try's) are what the factory is given to choose its rules.
    ``metrics`` defaults to Airflow's ``Stats`` (``observability.assets``): commit durations, files,
    rows, retries and aborts go wherever ``[metrics]`` sends Airflow's own.
    ``allow_beyond_horizon`` is an operator's word that an epoch older than the table's snapshot
    history is not in the table (``eo-sink commit --beyond-horizon``); never set by a task.
    ``[exactly_once] full_file_check_after_seconds`` is read here, when the coordinator is built.
    """
    from airflow_provider_exactly_once.observability.assets import airflow_metrics

    if fault is None:
        fault = configured_fault_hook(sink.sink_id, epoch, try_number)
    if store is None:
        store = open_meta_store(meta_conn_id)
    source = checkpoint_source(checkpoint, store.checkpoints)
    if metrics is None:
        metrics = airflow_metrics()
    if committer is None:
        committer = sink_committer(sink, fault=fault, metrics=metrics)
    from airflow_provider_exactly_once.core.coordinator import FULL_FILE_CHECK_AFTER, TwoPhaseCommitCoordinator

    return TwoPhaseCommitCoordinator(
        store,
        {sink.sink_id: committer},
        source,
        fault=fault,
        metrics=metrics,
        allow_beyond_horizon=allow_beyond_horizon,
        full_file_check_after=configured_duration(
            FULL_FILE_CHECK_OPTION, FULL_FILE_CHECK_AFTER, "seconds", zero_allowed=True
        ),
        on_reprocess={sink.sink_id: sink.on_reprocess},
        audited=[sink.sink_id] if getattr(sink, "audited", False) else [],
    )


def meta_conn_id_or_configured(meta_conn_id: str | None) -> str:
    """``meta_conn_id``, or when it is ``None`` ``[exactly_once] meta_conn_id`` (default
    ``exactly_once_default``): the one place every task, the trigger and the UI resolve it.

    Read when a task runs, not when its DAG is parsed, so that a deployment moves every DAG to
    another meta store by its configuration and a parse reads no more configuration than Airflow's.
    """
    if meta_conn_id is not None:
        return meta_conn_id
    from airflow_provider_exactly_once.version_compat import conf

    configured = conf.get(CONFIG_SECTION, META_CONN_ID_OPTION, fallback=DEFAULT_META_CONN_ID)
    return str(configured or DEFAULT_META_CONN_ID).strip() or DEFAULT_META_CONN_ID


def open_meta_store(meta_conn_id: str | None) -> SqlSinkStateStore:
    """The meta store of an Airflow connection (``None``: the configured one); the hook (and
    SQLAlchemy's engine) load only in a task that opens one, not when a DAG file naming the
    operators is parsed."""
    from airflow_provider_exactly_once.hooks.meta_store import ExactlyOnceMetaStoreHook

    return ExactlyOnceMetaStoreHook(meta_conn_id_or_configured(meta_conn_id)).get_store()


def run_epoch(context: Mapping[str, Any], sink_id: str, meta_conn_id: str | None) -> int:
    """The run's epoch (``runtime.run_epochs.epoch_for_context``), opening the meta store only when the
    run has no data interval and its epoch must be allocated."""
    epoch = interval_epoch(context)
    if epoch is not None:
        return epoch
    store = open_meta_store(meta_conn_id)
    try:
        return epoch_for_context(context, sink_id, store.epochs)
    finally:
        store.dispose()


def registered_configs(registry: SinkRegistry, sink_id: str) -> tuple[SinkConfig, CheckpointConfig | None] | None:
    """The sink's config and checkpoint config (``None``: the meta-store checkpoint table) as
    registered, or ``None`` for a sink never registered."""
    registration = registry.registered_sink(sink_id)
    if registration is None:
        return None
    sink_dict, checkpoint_dict = registration
    checkpoint = None if checkpoint_dict is None else checkpoint_config_from_dict(checkpoint_dict)
    return sink_config_from_dict(sink_dict), checkpoint


@contextmanager
def reaching(sink: SinkConfig) -> Iterator[None]:
    """A sink's storage that cannot be opened: a connection that is not there is ``InvalidSinkConfig``,
    anything else ``SinkUnavailable`` naming the catalog or file system, credentials masked."""
    from airflow_provider_exactly_once.version_compat import AirflowNotFoundException

    try:
        yield
    except ExactlyOnceError:
        raise
    except AirflowNotFoundException as exc:
        raise InvalidSinkConfig(mask_userinfo(f"sink {sink.sink_id!r}: {exc}")) from None
    except Exception as exc:
        raise SinkUnavailable(unreachable(sink, exc)) from None


def unreachable(sink: SinkConfig, exc: Exception) -> str:
    """Why the sink's catalog or file system cannot be reached, naming it, credentials masked."""
    lines = str(exc).strip().splitlines()
    why = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    conn_id = getattr(sink, "iceberg_conn_id", None)
    if conn_id is None:
        where = f"the file system of root {sink.model_dump(mode='json').get('root')!r}"
    else:
        where = f"the Iceberg catalog of connection {conn_id!r}"
        uri = _catalog_uri(conn_id)
        if uri:
            where += f" ({uri})"
    return mask_userinfo(
        f"sink {sink.sink_id!r}: {where} cannot be reached: {why}; check that it is up and that the "
        "connection is right, then retry"
    )


def _catalog_uri(conn_id: str) -> str | None:
    """The catalog's URI from its connection, to name it in a message (masked by the caller)."""
    try:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
    except Exception:  # naming the catalog is a courtesy: the refusal stands without it
        return None
    uri = conn.host or (conn.extra_dejson or {}).get("uri")  # the host wins, as in IcebergHook
    return str(uri) if uri else None
