"""The Spark write's targets, derived from the sink config when the task runs.

The sink config already names the table(s), the part of the input each table gets, the catalog
connection and the schema-evolution setting the commit uses; deriving the write's targets from it
means the two cannot disagree. The catalog properties (which may hold credentials) are read from
the Iceberg connection in ``execute`` and go only into the job spec file handed to
``spark-submit``: they are never a templated field, so they never appear in Rendered Templates.
A file sink's credentials come the same way from its config's ``storage_options`` (what its
committer uses), translated into the FileIO properties the Spark executors write with. The
templated ``input=`` and ``target=`` are refused when they hold credentials (``check_no_credentials``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from airflow_provider_exactly_once.core.errors import CREDENTIAL_PROPERTY_MARKS, InvalidSinkConfig
from airflow_provider_exactly_once.hooks.storage import resolved_storage_options
from airflow_provider_exactly_once.runtime.assembly import as_sink, open_meta_store
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.spark.author_specs import FileSinkTarget


def iceberg_catalog_properties(conn_id: str) -> dict[str, str]:
    """The pyiceberg catalog properties of an Iceberg connection, built as ``IcebergHook.catalog``
    builds them (extra, then the host as ``uri``, ``type`` defaulting to ``rest``, login and
    password as the REST ``credential``), so Spark's driver loads the same catalog the commit does."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    properties: dict[str, str] = {str(k): str(v) for k, v in (conn.extra_dejson or {}).items()}
    if conn.host:
        properties["uri"] = conn.host.rstrip("/")
    properties.setdefault("type", "rest")
    if properties["type"] == "rest" and conn.login and conn.password:
        properties["credential"] = f"{conn.login}:{conn.password}"
    return properties


_S3_SCHEMES = ("s3", "s3a", "s3n")


def check_no_credentials(what: str, properties: Mapping[str, Any]) -> None:
    """Refuse credentials in a templated field: Airflow stores and shows every rendered value."""
    found = sorted(k for k in properties if any(mark in str(k).lower() for mark in CREDENTIAL_PROPERTY_MARKS))
    if found:
        raise InvalidSinkConfig(
            f"{what} holds credentials ({', '.join(found)}), and it is a templated field the UI shows once "
            "rendered: put them in the sink's connection (Iceberg) or storage_options (file sink), or leave "
            "them to the executors' environment (instance profile, web identity)"
        )


def check_templated_specs(
    task_id: object, input_spec: Mapping[str, Any], target_spec: Mapping[str, Any] | None
) -> None:
    """The operator's ``input=`` and ``target=`` are rendered and stored by Airflow: no credentials."""
    for name in ("io_properties", "options"):
        check_no_credentials(f"task {task_id}: input {name}", dict(input_spec.get(name) or {}))
    if target_spec is not None:
        check_no_credentials(f"task {task_id}: target io_properties", dict(target_spec.get("io_properties") or {}))


#: s3fs options (top level or in ``client_kwargs``) and the FileIO properties that say the same.
_S3FS_TO_FILEIO = {
    "key": "s3.access-key-id",
    "secret": "s3.secret-access-key",
    "token": "s3.session-token",
    "profile": "s3.profile-name",
    "endpoint_url": "s3.endpoint",
    "region_name": "s3.region",
}
#: botocore ``Config`` settings with a FileIO equivalent; the rest (retries, pool sizes) only tune
#: the client and are left to pyarrow's defaults.
_BOTOCORE_TO_FILEIO = {"connect_timeout": "s3.connect-timeout", "read_timeout": "s3.request-timeout"}


#: Where a file sink's writer takes FileIO settings the translation cannot give.
FILE_SINK_FIX = "target=FileSinkTarget(io_properties=...)"
#: Where a landing directory's reader does.
INPUT_FIX = "input=FilesInput(io_properties=...)"


def file_sink_io_properties(
    root: str, storage_options: Mapping[str, Any], *, what: str = "file sink root", fix: str = FILE_SINK_FIX
) -> dict[str, str]:
    """The FileIO properties (for the Spark executors' pyarrow) equivalent to resolved fsspec
    ``storage_options`` of ``root`` (a file sink's, for its committer; or a landing directory's, from
    its connection), so the writer reaches the store as the same principal.

    Only s3fs's options are translated. An option that would change where or as whom the writer
    connects, and has no FileIO equivalent, is refused rather than dropped: the writer would then
    reach the store differently from the committer. ``what`` and ``fix`` word the refusal.
    """
    scheme = urlparse(root).scheme.lower()
    if not storage_options or scheme in ("", "file", "local"):
        return {}  # local options (auto_mkdir...) concern fsspec alone
    if scheme not in _S3_SCHEMES:
        raise InvalidSinkConfig(
            f"{what} {root!r}: storage options are translated for the Spark writer only on S3; give "
            f"the writer its FileIO settings in {fix} and its credentials through the executors' environment"
        )
    properties: dict[str, str] = {}
    unknown: list[str] = []
    flat = [(k, v) for k, v in storage_options.items() if k not in ("client_kwargs", "config_kwargs")]
    flat += [(f"client_kwargs.{k}", v) for k, v in dict(storage_options.get("client_kwargs") or {}).items()]
    for name, value in flat:
        short = name.removeprefix("client_kwargs.")
        if short in _S3FS_TO_FILEIO and value is not None:
            properties[_S3FS_TO_FILEIO[short]] = str(value)
        elif name == "anon":
            properties["s3.anonymous"] = "true" if value else "false"
        elif not (name == "client_kwargs.verify" and value is True):  # certificate checks are pyarrow's default
            unknown.append(name)
    config = dict(storage_options.get("config_kwargs") or {})
    for name, value in config.items():
        if name in _BOTOCORE_TO_FILEIO:
            properties[_BOTOCORE_TO_FILEIO[name]] = str(value)
        elif name == "s3" and isinstance(value, Mapping) and set(value) <= {"addressing_style"}:
            properties["s3.force-virtual-addressing"] = (
                "true" if value.get("addressing_style") == "virtual" else "false"
            )
    if unknown:
        raise InvalidSinkConfig(
            f"{what} {root!r}: storage options {sorted(unknown)} have no pyiceberg FileIO equivalent for "
            f"the Spark writer; give it its FileIO settings in {fix}"
        )
    return properties


def check_target_for(sink: SinkConfig, target: FileSinkTarget | None) -> None:
    """Refuse, when the DAG is parsed, a sink the epoch writer cannot write as configured."""
    if isinstance(sink, IcebergSinkConfig):
        if target is not None:
            raise InvalidSinkConfig(
                f"sink {sink.sink_id!r}: an Iceberg sink's target is derived from the sink; do not give target="
            )
    elif target is not None and target.root != FileSinkTarget(root=sink.root).root:
        raise InvalidSinkConfig(
            f"sink {sink.sink_id!r}: target root {target.root!r} is not the sink's root {sink.root!r}"
        )


def targets_for(sink: SinkConfig, target: FileSinkTarget | None, partition_by: list[str]) -> list[dict[str, Any]]:
    """The job spec's targets: every table of an Iceberg sink, in the sink's order, with its
    selection and the connection's catalog properties; or the sink's root (``target`` adds FileIO
    and Parquet settings for a file sink)."""
    from airflow_provider_exactly_once.spark.jobspec import IcebergTarget

    check_target_for(sink, target)
    if isinstance(sink, IcebergSinkConfig):
        properties = iceberg_catalog_properties(sink.iceberg_conn_id)
        targets = []
        for table in sink.tables:
            selection = sink.select.get(table)
            # pyiceberg's SQL catalog keys tables by catalog name; IcebergHook names it after the connection.
            targets.append(
                IcebergTarget(
                    catalog_name=sink.iceberg_conn_id,
                    catalog_properties=properties,
                    table=table,
                    where=None if selection is None else selection.where,
                    query=None if selection is None else selection.query,
                    branch=sink.branch,
                    upsert=sink.upsert,
                ).model_dump(mode="json", exclude_none=True)
            )
        return targets
    assert isinstance(sink, FileSinkConfig)
    base = target or FileSinkTarget(root=sink.root)
    update: dict[str, Any] = {
        # Resolved here, in the task: the storage connection's secret goes into the spec file only.
        "io_properties": {
            **file_sink_io_properties(sink.root, resolved_storage_options(sink)),
            **base.io_properties,
        }
    }
    if partition_by:
        update["partition_by"] = list(partition_by)
    return [base.model_copy(update=update).model_dump(mode="json")]


#: The arguments the write operator no longer takes, and what an author writes instead.
_REMOVED_ARGUMENTS = {
    "sink_id": "give sink=IcebergSinkConfig(...) or sink=FileSinkConfig(...): the sink, given once, names its id",
    "allow_schema_evolution": "set it on the sink: IcebergSinkConfig(..., allow_schema_evolution=True)",
}


def refuse_removed_arguments(operator: str, kwargs: Mapping[str, Any]) -> None:
    """A removed spelling refused naming the one that replaced it, not as an unknown argument."""
    for name, instead in _REMOVED_ARGUMENTS.items():
        if name in kwargs:
            raise TypeError(f"{operator}({name}=) was removed: {instead}")


def sink_with_target(
    sink: SinkConfig | Mapping[str, Any], target: object, partition_by: Sequence[str], task_id: object
) -> SinkConfig:
    """The sink config, with the file sink's target and partitions checked against it at parse time."""
    if sink is None:
        raise InvalidSinkConfig(f"task {task_id}: give sink=IcebergSinkConfig(...) or sink=FileSinkConfig(...)")
    config = as_sink(sink)
    if isinstance(config, IcebergSinkConfig) and partition_by:
        raise InvalidSinkConfig(
            f"task {task_id}: sink {config.sink_id!r} is an Iceberg sink, partitioned by its table's spec"
        )
    file_target = target
    if isinstance(target, dict) and target.get("kind", "files") == "files":
        try:
            file_target = FileSinkTarget.model_validate(target)
        except ValueError as exc:
            raise InvalidSinkConfig(f"task {task_id}: invalid file sink target: {exc}") from None
    if file_target is not None and not isinstance(file_target, FileSinkTarget):
        raise InvalidSinkConfig(f"task {task_id}: with sink= only a file sink's FileSinkTarget may be given")
    check_target_for(config, file_target)
    return config


def upstream_settings(
    task_id: object,
    input_spec: Mapping[str, Any],
    target: Mapping[str, Any],
    meta_conn_id: str | None,
    sink_id: str,
    epoch: int,
    run_id: str,
) -> dict[str, Any]:
    """For an incremental input, the job spec's range, reserved now or before
    (``runtime.run_epochs``), and the upstream's catalog: the input's connection, else the
    sink's. Nothing for any other input."""
    if input_spec.get("kind") != "iceberg_table":
        return {}
    from airflow_provider_exactly_once.runtime.run_epochs import current_snapshot_of, reserved_range
    from airflow_provider_exactly_once.spark.author_specs import IcebergTableInput

    source = IcebergTableInput.model_validate(input_spec)
    if source.catalog_conn_id is not None:
        name, properties = source.catalog_conn_id, iceberg_catalog_properties(source.catalog_conn_id)
    elif target.get("kind") == "iceberg":
        name, properties = str(target["catalog_name"]), dict(target["catalog_properties"])
    else:
        raise InvalidSinkConfig(
            f"task {task_id}: the iceberg_table input {source.table!r} names no catalog_conn_id, and the sink is "
            "not an Iceberg sink whose catalog it could share: give catalog_conn_id"
        )
    store = open_meta_store(meta_conn_id)
    try:
        reserved = reserved_range(
            store,
            sink_id,
            epoch,
            source.table,
            current_snapshot_of(name, properties, source.table),
            start_after_snapshot_id=source.start_after_snapshot_id,
            run_id=run_id,
        )
    finally:
        store.dispose()
    return {"input_range": reserved.model_dump(), "input_catalog_name": name, "input_catalog_properties": properties}
