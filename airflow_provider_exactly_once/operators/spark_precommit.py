"""The write step of an epoch: ``spark-submit`` of the epoch writer (or a Spark Connect client), its
pre-commit metadata to XCom, and what the write derives when its task runs (targets, Connect
settings, whether this worker can run ``spark-submit``).

It runs the Spark provider's ``SparkSubmitOperator`` inside its task rather than subclassing it, so
a DAG parse does not pay that import (design.md, "Use, do not rewrite"). Every try gets a new
``write_id`` and so a new write location, and ``durable`` defaults to False: a retry never touches,
nor re-attaches to, an earlier try's write. The contract: design.md D17.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from datetime import datetime
from importlib import metadata, util
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlparse

from airflow.sdk import BaseOperator

from airflow_provider_exactly_once.core.epochs import check_epoch, check_sink_id, epoch_start, new_write_id
from airflow_provider_exactly_once.core.errors import CREDENTIAL_PROPERTY_MARKS, InvalidSinkConfig, MetaStoreUnavailable
from airflow_provider_exactly_once.defaults import DEFAULT_SPARK_CONNECT_RETRY, SPARK_CONNECT_RETRY_OPTION
from airflow_provider_exactly_once.extras import DISTRIBUTION
from airflow_provider_exactly_once.hooks.storage import resolved_storage_options
from airflow_provider_exactly_once.operators._common import airflow_errors, execute_nested
from airflow_provider_exactly_once.runtime.assembly import as_sink, open_meta_store, run_epoch
from airflow_provider_exactly_once.runtime.run_epochs import epoch_interval, generation_for_context
from airflow_provider_exactly_once.sinks.config import FileSinkConfig, IcebergSinkConfig, SinkConfig
from airflow_provider_exactly_once.spark import author_specs
from airflow_provider_exactly_once.spark.author_specs import FileSinkTarget
from airflow_provider_exactly_once.upstream_private import spark_binary_of
from airflow_provider_exactly_once.version_compat import AirflowNotFoundException, spark_submit_has_durable

if TYPE_CHECKING:
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from airflow_provider_exactly_once.core.precommit import PreCommit
    from airflow_provider_exactly_once.spark.jobspec import EpochJobSpec

#: Above this many bytes of compact JSON the XCom value is compressed (``xcom_value``).
XCOM_COMPRESS_ABOVE = 64 * 1024
#: The application ``spark-submit`` runs: the epoch writer module's own file.
EPOCH_WRITER_APPLICATION = str(Path(author_specs.__file__).with_name("epoch_writer.py"))

#: ``SparkSubmitOperator``'s parameters it templates (Spark provider 6.3; a test checks them against
#: the installed provider): the same ones are templated here and handed over rendered.
SPARK_SUBMIT_TEMPLATE_FIELDS = (
    "application",
    "conf",
    "files",
    "py_files",
    "jars",
    "driver_class_path",
    "packages",
    "exclude_packages",
    "keytab",
    "principal",
    "proxy_user",
    "name",
    "env_vars",
    "post_submit_commands",
    "properties_file",
)
#: Its other parameters, handed over as given. ``application_args`` is not one: the writer's only
#: argument is the job spec this operator writes.
SPARK_SUBMIT_OTHER_PARAMETERS = frozenset(
    {
        "conn_id",
        "archives",
        "java_class",
        "repositories",
        "total_executor_cores",
        "executor_cores",
        "executor_memory",
        "driver_memory",
        "num_executors",
        "status_poll_interval",
        "verbose",
        "spark_binary",
        "yarn_queue",
        "deploy_mode",
        "use_krb5ccache",
        "track_driver_via_k8s_api",
        "yarn_track_via_rm_api",
        "yarn_rm_auth",
        "openlineage_inject_parent_job_info",
        "openlineage_inject_transport_info",
        "reconnect_on_retry",
    }
)


class SparkPreCommitOperator(BaseOperator):
    """Write one epoch with Spark and return its pre-commit metadata (a dict) as the task's XCom.

    Spark parameters are ``SparkSubmitOperator``'s (``conn_id``, ``conf``, ``executor_memory``,
    ``deploy_mode``, ...), given here, or in the DAG's ``default_args``, as they would be there; the
    task runs a ``SparkSubmitOperator`` with them. ``application`` defaults to the epoch writer.

    :param sink: the sink the epoch is written for (``IcebergSinkConfig``, ``FileSinkConfig`` or a
        dict): the same config the epoch group gets. The tables (every one of a fan-out, each with
        its ``select``), their catalog (the sink's Iceberg connection, read when the task runs) and
        ``allow_schema_evolution`` come from it; for a file sink, its root. One ``spark-submit``
        writes every table from one read of the input and returns one pre-commit listing them all.
    :param input: where the epoch's rows come from (``spark.jobspec`` input spec, or its dict). A
        landing directory on S3 is read with the storage properties of the sink's catalog or file
        sink unless its ``io_properties`` say otherwise; being templated, it may hold no credentials.
    :param input_storage_conn_id: an Airflow connection of type ``aws`` (read as
        ``storage_conn_id`` is, ``hooks.storage``) for a landing directory on S3 that is not in the
        tables' store or not readable with their credentials; it replaces their storage properties.
    :param partition_by: identity partition columns of a file sink (Iceberg tables have their spec).
    :param target: only for a file sink whose files need FileIO properties or Parquet settings
        (a ``FileSinkTarget`` on the sink's root). Templated, so no credentials: a file sink's come
        from its ``storage_options``, translated for the writer.
    :param writers: number of parallel write tasks (see ``EpochJobSpec.writers``).
    :param epoch: override the epoch derived from the run (its data interval start, or for runs
        without one an allocation keyed by run id in the meta store of ``meta_conn_id``).
    :param meta_conn_id: the meta store connection, used only for runs without a data interval.
    :param xcom_compress_above: return ``PreCommit.to_compressed()`` text instead of a dict once the
        compact JSON is larger than this many bytes (``None``: never). ``PreCommit.parse`` reads both.
    :param work_dir: local directory for the job spec and the returned metadata (a temporary
        directory by default). It must be reachable by the driver: client deploy mode, or a shared
        path in cluster mode.
    """

    # The derived target (with the catalog's properties) is deliberately not a field: rendered
    # fields are stored and shown in the UI, and catalog properties may hold credentials.
    template_fields = (*SPARK_SUBMIT_TEMPLATE_FIELDS, "sink_id", "input_spec", "target_spec")
    template_fields_renderers: ClassVar[dict[str, str]] = {
        "conf": "json",
        "env_vars": "json",
        "input_spec": "json",
        "target_spec": "json",
    }
    ui_color = "#fde9d9"

    def __init__(
        self,
        *,
        input: dict[str, Any]
        | author_specs.FilesInput
        | author_specs.TableInput
        | author_specs.SqlInput
        | author_specs.FunctionInput
        | author_specs.IcebergTableInput,
        sink: SinkConfig | Mapping[str, Any],
        partition_by: Sequence[str] = (),
        target: dict[str, Any] | author_specs.FileSinkTarget | None = None,
        writers: int | None = None,
        target_file_size_bytes: int | None = None,
        epoch: int | None = None,
        work_dir: str | None = None,
        xcom_compress_above: int | None = XCOM_COMPRESS_ABOVE,
        application: str = EPOCH_WRITER_APPLICATION,
        meta_conn_id: str | None = None,
        durable: bool = False,
        input_storage_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        refuse_removed_arguments(type(self).__name__, kwargs)
        sink_cfg = sink_with_target(sink, target, partition_by, kwargs.get("task_id"))
        sink_id = sink_cfg.sink_id
        spark = _spark_parameters(kwargs, kwargs.get("task_id"))
        super().__init__(**kwargs)
        self.application = application
        self.name: str = spark.pop("name", None) or f"exactly-once-{sink_id}"
        for field in SPARK_SUBMIT_TEMPLATE_FIELDS:
            if field not in ("application", "name"):
                setattr(self, field, spark.pop(field, None))
        self.conn_id: str = spark.pop("conn_id", "spark_default")
        self.spark_submit_kwargs = spark
        self.durable = durable
        self._submit: SparkSubmitOperator | None = None  # this try's spark-submit, for on_kill
        self.sink = sink_cfg
        self.sink_id = sink_id
        self.partition_by = list(partition_by)
        self.input_spec = input.model_dump(mode="json") if not isinstance(input, dict) else input
        self.target_spec = (
            None if target is None else target.model_dump(mode="json") if not isinstance(target, dict) else target
        )
        check_templated_specs(self.task_id, self.input_spec, self.target_spec)
        if input_storage_conn_id is not None and self.input_spec.get("kind") != "files":
            raise InvalidSinkConfig(
                f"task {self.task_id}: input_storage_conn_id is for a landing directory (a files input), "
                f"not for a {self.input_spec.get('kind')!r} input; drop it"
            )
        self.input_storage_conn_id = input_storage_conn_id
        self.allow_schema_evolution = isinstance(sink_cfg, IcebergSinkConfig) and sink_cfg.allow_schema_evolution
        self.writers = writers
        self.target_file_size_bytes = target_file_size_bytes
        self.epoch = epoch
        self.meta_conn_id = meta_conn_id
        self.work_dir = work_dir
        self.xcom_compress_above = xcom_compress_above
        self._pre_commit: PreCommit | None = None  # this try's write, for OpenLineage
        self._target: dict[str, Any] = {}  # this try's resolved target, for OpenLineage

    def _resolve_targets(self) -> list[dict[str, Any]]:
        file_target = None
        if self.target_spec is not None:
            try:
                file_target = author_specs.FileSinkTarget.model_validate(self.target_spec)
            except ValueError as exc:
                raise InvalidSinkConfig(f"task {self.task_id}: invalid file sink target: {exc}") from None
        return targets_for(self.sink, file_target, self.partition_by)

    def execute(self, context: Any) -> dict[str, Any] | str:
        # A wrong sink, target or input fails the task without retries: a retry would fail the same way.
        with airflow_errors():
            return self._execute(context)

    def _execute(self, context: Any) -> dict[str, Any] | str:
        # The job spec's models are built here, in the task, never when the DAG file is parsed.
        from airflow_provider_exactly_once.spark import jobspec

        check_sink_id(self.sink_id)  # templated: only the rendered value can be checked
        start: datetime | None = context.get("data_interval_start")
        end: datetime | None = context.get("data_interval_end")
        if self.epoch is not None:
            epoch = check_epoch(self.epoch)
        else:
            # The same rule every task of the run applies (interval start, else an allocation keyed by
            # run id in the meta store), so write, persist and commit always agree on the epoch.
            epoch = run_epoch(context, self.sink_id, self.meta_conn_id)
        if start is None:
            start = epoch_start(epoch)
        end = end or start
        generation = generation_for_context(context)
        kept = self._kept_write(epoch, generation, str(context.get("run_id")))
        if kept is not None:
            return xcom_value(kept, self.xcom_compress_above)
        targets = self._revision_targets(self._resolve_targets(), epoch, generation)
        upstream = upstream_settings(
            self.task_id,
            self.input_spec,
            targets[0],
            self.meta_conn_id,
            self.sink_id,
            epoch,
            str(context.get("run_id")),
        )
        # Lineage names the write's tables from the pre-commit; the target gives their catalog.
        self._target = targets[0]
        write_id = new_write_id()
        work = Path(tempfile.mkdtemp(prefix=f"eo-{write_id[:8]}-", dir=self.work_dir))
        output = work / "pre-commit.json"
        try:
            try:
                spec = jobspec.EpochJobSpec.model_validate(
                    {
                        "sink_id": self.sink_id,
                        "epoch": epoch,
                        "write_id": write_id,
                        "data_interval_start": start,
                        "data_interval_end": end,
                        "input": self.input_spec,
                        "targets": targets,
                        "output_path": str(output),
                        "input_io_properties": self._input_io_properties(),
                        **upstream,
                        "allow_schema_evolution": self.allow_schema_evolution,
                        "writers": self.writers,
                        "target_file_size_bytes": self.target_file_size_bytes,
                    }
                )
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                raise InvalidSinkConfig(f"task {self.task_id}: invalid epoch writer settings: {exc}") from None
            self.log.info(
                "Writing sink %r %s as write %s into %s",
                spec.sink_id,
                epoch_interval(epoch, context),
                write_id,
                ", ".join(t.table if isinstance(t, jobspec.IcebergTarget) else t.root for t in spec.targets),
            )
            url = connect_url(self.conn_id)
            written = self._submit_write(spec, work, context) if url is None else self._connect_write(url, spec)
            pre_commit = written.model_copy(update={"generation": generation})
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._pre_commit = pre_commit
        self.log.info(
            "%s: %d file(s), %d row(s) written",
            pre_commit.describe(),
            sum(len(t.data_files) for t in pre_commit.tables),
            pre_commit.record_count,
        )
        return xcom_value(pre_commit, self.xcom_compress_above)

    def _submit_write(self, spec: EpochJobSpec, work: Path, context: Any) -> PreCommit:
        """The write as a ``spark-submit`` of the epoch writer, its pre-commit read from ``work``."""
        from airflow_provider_exactly_once.core.precommit import PreCommit
        from airflow_provider_exactly_once.spark import jobspec

        output = work / "pre-commit.json"
        spec_path = work / "job.json"
        jobspec.dump_spec(spec, spec_path)
        submit = self._spark_submit(spec_path)
        check_spark_submit(self.task_id, spark_binary_of(submit), self.conn_id)
        try:
            self._submit = submit
            execute_nested(submit, context)
        except Exception as exc:
            error_file = Path(str(output) + ".error")
            if error_file.exists():
                raise _write_failed(spec, error_file.read_text(encoding="utf-8")) from exc
            raise
        if output.exists():
            return PreCommit.from_json(output.read_bytes())
        # A driver whose files this task cannot see (cluster deploy mode, a remote driver) left the
        # pre-commit in the write location too.
        from airflow_provider_exactly_once.spark.epoch_writer import left_pre_commit

        left = left_pre_commit(spec)
        if left is None or left.write_id != spec.write_id:
            raise RuntimeError(
                f"the epoch writer finished but left no pre-commit metadata, neither at {output} nor in the write "
                f"location of write {spec.write_id}"
            )
        return left

    def _connect_write(self, url: str, spec: EpochJobSpec) -> PreCommit:
        """The write as a client of the Spark Connect server at ``url``, in this task's process."""
        from airflow_provider_exactly_once.core.errors import ExactlyOnceError
        from airflow_provider_exactly_once.spark.connect_write import server_lost, write_through_connect
        from airflow_provider_exactly_once.spark.epoch_writer import describe_failure

        given = {f: getattr(self, f) for f in SPARK_SUBMIT_TEMPLATE_FIELDS} | self.spark_submit_kwargs
        if self.application == EPOCH_WRITER_APPLICATION:
            given.pop("application")
        conf, ignored = connect_settings(given)
        if ignored:
            self.log.warning(
                "connection %r is a Spark Connect server: %s shape a spark-submit driver and are not applied "
                "(set them on the server)",
                self.conn_id,
                ", ".join(ignored),
            )
        retry_seconds = connect_retry_seconds()  # a bad setting fails here, naming the option
        try:
            return write_through_connect(url, spec, conf, retry_seconds=retry_seconds)
        except ExactlyOnceError:
            raise
        except Exception as exc:
            described = describe_failure(exc)
            if server_lost(exc):
                described = (
                    f"the Spark Connect server of connection {self.conn_id!r} went away during the write (restarted, "
                    f"replaced or unreachable: {described}); this write can never be committed: a retry writes the "
                    "epoch anew under a new write id, and the recovery DAG deletes what this one left"
                )
            raise _write_failed(spec, described) from exc

    def _spark_submit(self, spec_path: Path) -> SparkSubmitOperator:
        """The Spark provider's operator for this try, with this task's id and rendered Spark settings."""
        from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

        given = {f: getattr(self, f) for f in SPARK_SUBMIT_TEMPLATE_FIELDS if getattr(self, f) is not None}
        extra: dict[str, Any] = {"durable": self.durable} if spark_submit_has_durable() else {}
        try:
            return SparkSubmitOperator(
                task_id=self.task_id,
                conn_id=self.conn_id,
                application_args=[str(spec_path)],
                **given,
                **self.spark_submit_kwargs,
                **extra,
            )
        except TypeError as exc:  # a parameter this installed Spark provider does not know
            raise InvalidSinkConfig(
                f"task {self.task_id}: the installed Spark provider's SparkSubmitOperator refused the Spark "
                f"settings: {exc}; drop the parameter or upgrade apache-airflow-providers-apache-spark"
            ) from None

    def on_kill(self) -> None:
        """A killed task kills its ``spark-submit`` (and, where the provider can, the driver)."""
        if self._submit is not None:
            self._submit.on_kill()

    def _input_io_properties(self) -> dict[str, str]:
        """The landing directory's FileIO properties from ``input_storage_conn_id``, read now, in the task."""
        if self.input_storage_conn_id is None:
            return {}
        from airflow_provider_exactly_once.hooks.storage import ObjectStorageHook

        path = str(self.input_spec.get("path") or "")
        options = ObjectStorageHook(self.input_storage_conn_id).storage_options()
        what = f"task {self.task_id}: landing path (input_storage_conn_id {self.input_storage_conn_id!r})"
        return file_sink_io_properties(path, options, what=what, fix=INPUT_FIX)

    def _kept_write(self, epoch: int, generation: str | None, run_id: str) -> PreCommit | None:
        """The committed write, when the sink keeps it (``on_reprocess="keep"``) and this run would
        only write a newer generation for persist to discard: then no Spark job runs at all."""
        if self.sink.on_reprocess != "keep" or generation is None:
            return None
        store = open_meta_store(self.meta_conn_id)
        try:
            row = store.get(self.sink_id, epoch)
            from airflow_provider_exactly_once.core.decisions import write_kept

            why = write_kept(row, generation, self.sink.on_reprocess)
            if why is None or row is None:
                return None
            self.log.warning("Spark job skipped: %s", why)
            try:  # the epoch's page and eo-sink show it; Airflow gives a task no way to set its own note
                store.record_warning(self.sink_id, epoch, warning=f"run {run_id}: {why}")
            except MetaStoreUnavailable:
                self.log.warning("could not record the skip on the epoch's row")
            return row.pre_commit
        finally:
            store.dispose()

    def _revision_targets(
        self, targets: list[dict[str, Any]], epoch: int, generation: str | None
    ) -> list[dict[str, Any]]:
        """The targets, each with its revision basis when this write revises the epoch's committed
        changes by key (``core.decisions`` decides from the epoch's row)."""
        sink = self.sink
        if not isinstance(sink, IcebergSinkConfig) or sink.upsert is None or generation is None:
            return targets
        if sink.on_reprocess != "replace":
            return targets
        store = open_meta_store(self.meta_conn_id)
        try:
            from airflow_provider_exactly_once.core.decisions import revision_basis

            basis = revision_basis(store.get(self.sink_id, epoch), generation, sink.on_reprocess)
        finally:
            store.dispose()
        if not basis:
            return targets
        self.log.warning(
            "sink %r epoch %d is committed with write %s: this write revises its changes, planned against the "
            "table as it was before them",
            self.sink_id,
            epoch,
            next(iter(basis.values())).write_id,
        )
        return [
            {**t, "revision": basis[t["table"]].model_dump(mode="json")} if t.get("table") in basis else t
            for t in targets
        ]

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Input: the landed files; outputs: the target's tables, with the write's schema, rows, bytes, files."""
        from airflow_provider_exactly_once.observability.lineage import write_lineage

        return write_lineage(self.input_spec, self._target or dict(self.target_spec or {}), self._pre_commit)


def _write_failed(spec: EpochJobSpec, cause: str) -> Exception:
    """The error of a write whose Spark job failed, ``cause`` the one line Spark's error says."""
    from airflow_provider_exactly_once.core.errors import WriteFailed

    where = f"sink {spec.sink_id!r} epoch {spec.epoch} write {spec.write_id}"
    return WriteFailed(f"epoch writer failed: {where}: {cause}", cause=cause)


def _spark_parameters(kwargs: dict[str, Any], task_id: object) -> dict[str, Any]:
    """Take ``SparkSubmitOperator``'s parameters out of ``kwargs`` (the rest are ``BaseOperator``'s),
    with the DAG's ``default_args`` filling those not given, as they fill the provider's own."""
    if "application_args" in kwargs:
        raise InvalidSinkConfig(
            f"task {task_id}: application_args is the epoch writer's job spec, which this operator writes; "
            "put the input in input= and Spark settings in conf="
        )
    names = {*SPARK_SUBMIT_TEMPLATE_FIELDS[1:], *SPARK_SUBMIT_OTHER_PARAMETERS}
    defaults = kwargs.get("default_args") or {}
    spark = {name: defaults[name] for name in names if name in defaults}
    spark.update({name: kwargs.pop(name) for name in names & kwargs.keys()})
    return spark


def xcom_value(pre_commit: PreCommit, compress_above: int | None = XCOM_COMPRESS_ABOVE) -> dict[str, Any] | str:
    """The XCom value: compact JSON (defaults left out; ``PreCommit.parse`` puts them back), readable
    in the UI while small; deflated text once large, because every descriptor repeats the same
    column names and path prefix and XCom rows travel through the API server into the metadata DB
    (measured: 10,000 files of 4 columns are about 6 MB compact, see bench/spark_writer.py)."""
    text = pre_commit.model_dump_json(exclude_defaults=True)
    if compress_above is not None and len(text) > compress_above:
        return pre_commit.to_compressed()
    value: dict[str, Any] = json.loads(text)
    return value


#: The Spark provider's connection type for Spark Connect (its ``SparkConnectHook``).
CONNECT_CONN_TYPE = "spark_connect"
#: Settings that mean nothing to a Connect session but are harmless to have: the application is the
#: writer's own, and the name only labels a ``spark-submit``.
_IGNORED = frozenset({"application", "name", "conf", "conn_id"})


def connect_url(conn_id: str) -> str | None:
    """The ``sc://`` URL of the connection when it is a Spark Connect one, else ``None`` (its token,
    if any, is in the URL: never log it)."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

    hook = SparkConnectHook(conn_id)
    try:
        conn_type = hook.get_connection(conn_id).conn_type
    except AirflowNotFoundException:  # the Spark provider's hook then submits to its default master
        return None
    if conn_type != CONNECT_CONN_TYPE:
        return None
    try:
        return hook.get_connection_url()
    except ValueError as exc:  # a path in the host, which the provider refuses
        raise InvalidSinkConfig(f"Spark Connect connection {conn_id!r}: {exc}") from None


def connect_settings(given: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The session settings of a Connect write (``conf``), and the ``spark-submit`` settings given
    that a Connect session has no place for."""
    ignored = sorted(name for name, value in given.items() if value not in (None, False) and name not in _IGNORED)
    return {str(key): str(value) for key, value in (given.get("conf") or {}).items()}, ignored


def connect_retry_seconds() -> float:
    """How long each call of a Connect write retries a server that does not answer:
    ``[exactly_once] spark_connect_retry_seconds``, a minute by default, read when the task runs."""
    from airflow_provider_exactly_once.runtime.assembly import configured_duration

    return configured_duration(SPARK_CONNECT_RETRY_OPTION, DEFAULT_SPARK_CONNECT_RETRY, "seconds").total_seconds()


_VERSION_LINE = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.MULTILINE)


def check_spark_submit(task_id: str, binary: str, conn_id: str) -> str:
    """The path of ``binary`` on ``PATH``, or an error naming both remedies."""
    found = shutil.which(binary)
    if found is None:
        raise InvalidSinkConfig(
            f"task {task_id}: no {binary!r} on this worker's PATH (asked for by the Spark connection {conn_id!r}): "
            f"install the [spark] extra, whose PySpark ships spark-submit (pip install '{DISTRIBUTION}[spark]'), "
            f"or put a Spark distribution's bin/ directory on the worker's PATH"
        )
    check_pyspark_files()
    return found


def check_pyspark_files() -> None:
    """Refuse a PySpark whose Python files are another release's.

    The Spark provider depends on ``pyspark-client``, which unpacks into the same ``pyspark/``
    directory as PySpark itself; when the two releases differ and the client was unpacked last,
    every Python function Spark runs (the writer's are) fails deep inside an executor.
    """
    spec = util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return  # no local PySpark: spark-submit comes from a Spark distribution, which is whole
    version_file = Path(spec.origin).with_name("version.py")
    try:
        installed = metadata.version("pyspark")
        match = _VERSION_LINE.search(version_file.read_text(encoding="utf-8"))
    except (metadata.PackageNotFoundError, OSError):
        return
    if match is not None and match.group(1) != installed:
        raise InvalidSinkConfig(
            f"the installed pyspark {installed} holds the Python files of release {match.group(1)} "
            f"(pyspark-client, a dependency of the Spark provider, unpacked over it): reinstall it with "
            f"pip install --force-reinstall --no-deps 'pyspark=={installed}', or keep pyspark-client out "
            f"(uv: override-dependencies = [\"pyspark-client; sys_platform == 'never'\"])"
        )


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
