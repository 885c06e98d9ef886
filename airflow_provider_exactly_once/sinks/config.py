"""Typed descriptions of a sink, validated once at construction (as cosmos's config classes are).

A DAG author writes one of these per sink; the Airflow layer resolves its connections and calls
``committer(...)``. Each is registered as ``model_dump(mode="json")`` next to its state and read back
by ``sink_config_from_dict`` in a process that never imported the DAG (the recovery DAG).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from airflow_provider_exactly_once.core.epochs import ON_REPROCESS, OnReprocess, check_sink_id
from airflow_provider_exactly_once.core.errors import (
    InvalidPreCommit,
    InvalidSinkConfig,
    find_control,
    has_userinfo,
    mask_userinfo,
)
from airflow_provider_exactly_once.core.faults import FaultHook, no_faults
from airflow_provider_exactly_once.filesystems import (
    ConfigModel,
    check_storage_conn_id,
    config_refusal,
    given_storage_options,
    refuse_secret_options,
)

if TYPE_CHECKING:
    # The committers bring pyiceberg, pyarrow and fsspec's filesystems: DAG files import these configs
    # at every parse, and only the tasks that commit need them (imported in ``committer``).
    from pyiceberg.catalog import Catalog

    from airflow_provider_exactly_once.core.cleanups import WriteFolderListing
    from airflow_provider_exactly_once.core.ports import SinkCommitter
    from airflow_provider_exactly_once.core.upserts import UpsertSpec
    from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
    from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter

    Upsert = UpsertSpec | None
else:
    # Checked by ``_valid_upsert``: an append sink's DAG parse need not import the upsert models.
    Upsert = Any


def _sink_id(sink_id: str) -> None:
    try:
        check_sink_id(sink_id)
    except InvalidPreCommit as exc:
        raise InvalidSinkConfig(str(exc)) from None


def _printable(sink_id: str, name: str, value: str) -> None:
    """A name that is registered and printed by the UI, eo-sink and the logs holds no control
    character: one that did would act on the terminal of whoever lists the sink."""
    if (control := find_control(value)) is not None:
        raise InvalidSinkConfig(
            f"sink {sink_id!r}: {name} {value!r} holds the control character {control}; "
            "give it in printable characters only"
        )


#: The temporary view a ``TableSelect.query`` reads the epoch's input from (the Spark write's name).
INPUT_VIEW = "epoch_input"


class TableSelect(ConfigModel):
    """Which part of the epoch's input one table of a fan-out gets, when not all of it.

    The Spark write reads the input once and gives each table its own part: ``where``, a Spark SQL
    condition over the input's columns (``"event_type = 'purchase'"``), or ``query``, a Spark SQL
    query reading the view ``epoch_input`` (``"SELECT user_id, sum(amount) AS total FROM epoch_input
    GROUP BY user_id"``). Either is fitted to the table's schema like the input itself.
    """

    what = "a table's selection"

    where: str | None = Field(default=None, exclude_if=lambda value: value is None)
    query: str | None = Field(default=None, exclude_if=lambda value: value is None)

    @model_validator(mode="after")
    def _one(self) -> TableSelect:
        given = [name for name in ("where", "query") if getattr(self, name) is not None]
        if len(given) != 1:
            raise InvalidSinkConfig(
                f"a table's selection takes exactly one of where= and query=, not {given or 'none'}"
            )
        for name in given:
            if not getattr(self, name).strip():
                raise InvalidSinkConfig(
                    f"a table's selection: {name} is not a non-empty string: {getattr(self, name)!r}"
                )
        if self.query is not None and INPUT_VIEW not in self.query.lower():
            raise InvalidSinkConfig(
                f"a table's selection: query {self.query!r} does not read the epoch's input, the view {INPUT_VIEW!r}"
            )
        return self


#: The flat upsert settings ``IcebergSinkConfig`` took before ``upsert=UpsertSpec(...)``: refused when
#: given, read only from a sink registered in that form (``sink_config_from_dict``).
_FLAT_UPSERT = ("mode", "key", "op_column", "op_values", "order_by")
#: The validation context under which a registered config is read.
_REGISTERED = "registered"


#: Who evaluates a ``SqlCheck``, in whose SQL dialect it is written (design.md D23).
EngineName = Literal["duckdb", "spark"]


class SqlCheck(BaseModel, frozen=True, extra="forbid"):
    """One built-in audit check: ``sql`` returns the rows that break it; ``message`` says what that
    means to whoever reads the failed audit (the check's name when not given).

    ``engine``: who runs ``sql`` (it is written in that engine's dialect). ``"duckdb"``: DuckDB in
    the task's memory over pyiceberg's read of the snapshot; ``"spark"``: Spark, for a snapshot
    too large for one task's memory, through the Spark Connect server of ``spark_conn_id`` (a
    ``spark_connect`` connection), or a local session in the task when it is not given. The
    views and the verdict are the same (``sinks/iceberg/audit_checks.py``).
    """

    name: str = Field(min_length=1, max_length=250)
    sql: str = Field(min_length=1)
    message: str = ""
    engine: EngineName = "duckdb"
    spark_conn_id: str | None = None

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        if not re.fullmatch(r"[\w.-]+", name):
            raise InvalidSinkConfig(f"audit check name {name!r}: use letters, digits, '_', '.' and '-' only")
        return name

    @model_validator(mode="after")
    def _spark_conn_for_spark(self) -> SqlCheck:
        if self.spark_conn_id is not None and self.engine != "spark":
            raise InvalidSinkConfig(
                f"audit check {self.name!r}: spark_conn_id is for engine='spark'; DuckDB needs no connection"
            )
        return self


def as_checks(checks: Sequence[SqlCheck | Mapping[str, Any]]) -> list[SqlCheck]:
    """The checks, validated once when the DAG is parsed; two of one name are refused, and so are
    Spark checks of different connections (one task runs them all, in one Spark session)."""
    parsed = [c if isinstance(c, SqlCheck) else SqlCheck.model_validate(c) for c in checks]
    names = [c.name for c in parsed]
    if len(set(names)) != len(names):
        raise InvalidSinkConfig(f"audit checks: names must be unique, got {names}")
    spark = {c.name: c.spark_conn_id for c in parsed if c.engine == "spark"}
    if len(set(spark.values())) > 1:
        raise InvalidSinkConfig(
            f"audit checks: the Spark checks run in one session, give them one spark_conn_id, got {spark}"
        )
    return parsed


class IcebergSinkConfig(ConfigModel):
    """One or more Iceberg tables written together (fan-out), reached through an Iceberg connection.

    ``select`` maps a table to the part of the input it gets (``TableSelect``); a table it does not
    name gets every row. One Spark write fills every table, so the split lives with the tables.
    """

    positional = ("sink_id", "tables")
    what = "sink configuration"

    kind: Literal["iceberg"] = "iceberg"
    sink_id: str
    tables: tuple[str, ...]
    iceberg_conn_id: str = "iceberg_default"
    branch: str = "main"
    allow_schema_evolution: bool = False
    #: Registered in seconds, as ``clock_skew_s``.
    clock_skew: timedelta = Field(default=timedelta(minutes=10), alias="clock_skew_s")
    max_commit_attempts: int = 8
    #: Left out of the registered form when empty (as ``on_reprocess`` at its default and an unset
    #: ``upsert``), so the registration of a sink that does not use it is unchanged.
    select: dict[str, TableSelect] = Field(default_factory=dict, exclude_if=lambda value: not value)
    #: What a newer generation's write (a cleared run, a reprocess backfill) does to a committed epoch:
    #: ``"replace"`` it atomically (a revision), or ``"keep"`` what was committed, for inputs that
    #: cannot be read again (the write task then skips its Spark job).
    on_reprocess: OnReprocess = Field(default="replace", exclude_if=lambda value: value == "replace")
    #: Every row is a change by key (insert or update, or a delete where the spec's ``op_column``
    #: says so), applied copy-on-write (``core.upserts.UpsertSpec``); ``None``: every row is new.
    upsert: Upsert = Field(default=None, exclude_if=lambda value: value is None)
    #: Write, audit, publish (design.md D23): each epoch is committed to an audit branch of every
    #: table, its checks run there, and only a write whose audit passed is published to ``branch``.
    #: ``exactly_once_epoch(audit=...)`` sets it; recovery reads it from the registered sink.
    audited: bool = Field(default=False, exclude_if=lambda value: not value)

    def __hash__(self) -> int:  # the selections and the upsert spec left out: a dict has no hash
        return hash((self.kind, self.sink_id, self.tables, self.iceberg_conn_id, self.branch))

    @model_validator(mode="before")
    @classmethod
    def _flat_upsert(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping) or not (flat := [name for name in _FLAT_UPSERT if name in data]):
            return data
        sink_id = data.get("sink_id")
        if not (info.context or {}).get(_REGISTERED):
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: IcebergSinkConfig({'=, '.join(flat)}=) was removed; write "
                "upsert=UpsertSpec(key=..., op_column=..., order_by=...) "
                "(from airflow_provider_exactly_once import UpsertSpec)"
            )
        values = {name: value for name, value in data.items() if name not in _FLAT_UPSERT}
        return {**values, "upsert": _upsert_spec(str(sink_id), {name: data[name] for name in flat})}

    @field_validator("sink_id")
    @classmethod
    def _valid_sink_id(cls, sink_id: str) -> str:
        _sink_id(sink_id)
        return sink_id

    @field_validator("tables", mode="before")
    @classmethod
    def _one_table(cls, tables: Any) -> Any:
        return (tables,) if isinstance(tables, str) else tables

    @field_validator("select", mode="before")
    @classmethod
    def _valid_select(cls, select: Any, info: ValidationInfo) -> Any:
        if "tables" not in info.data:
            return select
        return _selections(info.data["sink_id"], info.data["tables"], select)

    @field_validator("on_reprocess", mode="before")
    @classmethod
    def _valid_on_reprocess(cls, value: Any, info: ValidationInfo) -> Any:
        _on_reprocess(info.data.get("sink_id"), value)
        return value

    @field_validator("upsert", mode="before")
    @classmethod
    def _valid_upsert(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if isinstance(value, Mapping):
            return _validated_spec(info.data.get("sink_id"), value)
        from airflow_provider_exactly_once.core.upserts import UpsertSpec

        if not isinstance(value, UpsertSpec):
            raise InvalidSinkConfig(f"sink {info.data.get('sink_id')!r}: upsert is an UpsertSpec, got {value!r}")
        return value

    @field_serializer("clock_skew")
    def _seconds(self, clock_skew: timedelta) -> float:
        return clock_skew.total_seconds()

    @model_validator(mode="after")
    def _valid(self) -> IcebergSinkConfig:
        if not self.tables:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: name at least one table")
        for table in self.tables:
            if "." not in table.strip(".") or table != table.strip():
                raise InvalidSinkConfig(f"sink {self.sink_id!r}: table {table!r} is not 'namespace.table'")
            _printable(self.sink_id, "table", table)
        if len(set(self.tables)) != len(self.tables):
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: a table is listed twice in {list(self.tables)}")
        if not self.iceberg_conn_id:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: iceberg_conn_id is empty")
        if not self.branch:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: branch is empty")
        _printable(self.sink_id, "branch", self.branch)
        if self.clock_skew < timedelta(0):
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: clock_skew {self.clock_skew} is negative")
        if self.max_commit_attempts < 1:
            raise InvalidSinkConfig(f"sink {self.sink_id!r}: max_commit_attempts must be at least 1")
        return self

    def committer(self, catalog: Catalog, *, fault: FaultHook = no_faults) -> IcebergSinkCommitter:
        from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter

        return IcebergSinkCommitter(
            catalog,
            branch=self.branch,
            clock_skew=self.clock_skew,
            max_attempts=self.max_commit_attempts,
            allow_schema_evolution=self.allow_schema_evolution,
            fault=fault,
        )

    def write_folders(self, committer: SinkCommitter) -> WriteFolderListing:
        """Its write folders as the orphan scan lists them, through the catalog its committer
        (``committer``'s own) commits with: a scan opens nothing of its own."""
        from airflow_provider_exactly_once.sinks.iceberg import IcebergSinkCommitter
        from airflow_provider_exactly_once.sinks.write_locations import IcebergWriteFolders

        assert isinstance(committer, IcebergSinkCommitter), "the committer of this config (committer)"
        return IcebergWriteFolders(committer.catalog, self.tables)


def _upsert_spec(sink_id: str, given: Mapping[str, Any]) -> UpsertSpec | None:
    """The spec the flat settings describe, or ``None`` for an append sink."""
    mode = given.get("mode") or "append"
    if mode not in ("append", "upsert"):
        raise InvalidSinkConfig(f"sink {sink_id!r}: mode must be 'append' or 'upsert', got {mode!r}")
    key = given.get("key") or ()
    extra = [n for n in ("op_column", "order_by", "op_values") if given.get(n)]
    if mode == "append":
        if key or extra:
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: key, op_column, op_values and order_by are for mode='upsert' "
                f"(given: {['key'] * bool(key) + extra}); an append sink adds every row"
            )
        return None
    values = dict(given.get("op_values") or {})
    unknown = sorted(set(values) - {"insert", "update", "delete"})
    if unknown:
        raise InvalidSinkConfig(f"sink {sink_id!r}: op_values keys are insert, update and delete, not {unknown}")
    spec = {
        "key": (key,) if isinstance(key, str) else tuple(key),
        "op_column": given.get("op_column"),
        "order_by": given.get("order_by"),
        **{f"{name}_values": tuple(v) for name, v in values.items()},
    }
    return _validated_spec(sink_id, spec)


def _validated_spec(sink_id: str | None, spec: Mapping[str, Any]) -> UpsertSpec:
    from airflow_provider_exactly_once.core.upserts import UpsertSpec

    try:
        return UpsertSpec.model_validate(spec)
    except ValidationError as exc:
        faults = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'upsert'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise InvalidSinkConfig(
            f"sink {sink_id!r}: an upsert sink needs UpsertSpec(key=(column, ...)) naming the primary key; {faults}"
        ) from None


def _on_reprocess(sink_id: str | None, value: object) -> None:
    if value not in ON_REPROCESS:
        raise InvalidSinkConfig(
            f"sink {sink_id!r}: on_reprocess must be one of {list(ON_REPROCESS)}, got {value!r}: 'replace' makes a "
            "cleared or reprocessed run replace the epoch it re-writes, 'keep' keeps what was committed"
        )


def _selections(sink_id: str, tables: tuple[str, ...], select: object) -> dict[str, TableSelect]:
    """The per-table selections, each a ``TableSelect`` (its dict form accepted), for tables of the sink."""
    if not isinstance(select, Mapping):
        raise InvalidSinkConfig(f"sink {sink_id!r}: select maps table names to TableSelect, got {select!r}")
    out: dict[str, TableSelect] = {}
    for table, selection in select.items():
        if table not in tables:
            raise InvalidSinkConfig(f"sink {sink_id!r}: select names {table!r}, which is not one of {list(tables)}")
        try:
            if isinstance(selection, Mapping):
                selection = TableSelect(**selection)
        except (TypeError, InvalidSinkConfig) as exc:
            raise InvalidSinkConfig(f"sink {sink_id!r}: select of {table!r}: {exc}") from None
        if not isinstance(selection, TableSelect):
            raise InvalidSinkConfig(f"sink {sink_id!r}: select of {table!r} is not a TableSelect: {selection!r}")
        out[table] = selection
    return out


class FileSinkConfig(ConfigModel):
    """A directory of Parquet files (local path or fsspec URL) with deterministic final names.

    ``storage_conn_id`` names an Airflow connection of type ``aws`` holding the object store's
    credentials; it is read only where the filesystem is opened (the runtime resolves it for
    ``committer``, ``hooks.storage.resolved_storage_options``), so the config that is registered, passed through
    XCom and shown by the UI carries the id, never the secret.
    ``storage_options`` takes the other, non-secret fsspec options and refuses credentials.
    """

    positional = ("sink_id", "root")
    what = "sink configuration"

    kind: Literal["files"] = "files"
    sink_id: str
    root: str
    storage_options: dict[str, Any] = Field(default_factory=dict)
    #: Only ``"keep"`` (``_keep``); never registered.
    on_reprocess: OnReprocess = Field(default="keep", exclude=True)
    #: Left out of the registered form when unset, so the registration of a sink without one is unchanged.
    storage_conn_id: str | None = Field(default=None, exclude_if=lambda value: value is None)

    @field_validator("sink_id")
    @classmethod
    def _valid_sink_id(cls, sink_id: str) -> str:
        _sink_id(sink_id)
        return sink_id

    @field_validator("root")
    @classmethod
    def _valid_root(cls, root: str, info: ValidationInfo) -> str:
        sink_id = info.data.get("sink_id")
        if not root.strip():
            raise InvalidSinkConfig(f"sink {sink_id!r}: root is empty")
        if has_userinfo(root):
            # The root is recorded in the sink registry and shown by the UI, eo-sink and the logs.
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: root {mask_userinfo(root)!r} holds credentials (user:password@, "
                "or a secret query parameter such as token= or sig=); keep them out of the root and out of "
                "storage_options: put them in an Airflow connection of type 'aws' and name it in storage_conn_id"
            )
        _printable(str(sink_id), "root", root)
        if ".." in root.replace("\\", "/").split("/"):
            # The registered root would name one directory and the files go to another.
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: root {root!r} has a '..' segment; give the directory's own path, without '..'"
            )
        return root

    @field_validator("storage_options", mode="before")
    @classmethod
    def _no_secrets(cls, options: Any, info: ValidationInfo) -> dict[str, Any]:
        return refuse_secret_options(options, what=f"sink {info.data.get('sink_id')!r}")

    @field_validator("on_reprocess", mode="before")
    @classmethod
    def _keep(cls, value: Any, info: ValidationInfo) -> Any:
        sink_id = info.data.get("sink_id")
        _on_reprocess(sink_id, value)
        if value == "replace":
            # Final names are deterministic per epoch, and readers list the directory: a second write's
            # files cannot take the place of the first's in one step a reader could not see half done.
            raise InvalidSinkConfig(
                f"sink {sink_id!r}: a file sink cannot replace a committed epoch atomically (readers list "
                "the directory, so they would see the old and new files side by side while they are swapped); "
                "use on_reprocess='keep', or an Iceberg sink for data that is reprocessed"
            )
        return value

    @field_validator("storage_conn_id", mode="before")
    @classmethod
    def _valid_conn_id(cls, conn_id: Any, info: ValidationInfo) -> Any:
        check_storage_conn_id(conn_id, what=f"sink {info.data.get('sink_id')!r}")
        return conn_id

    def committer(
        self, *, fault: FaultHook = no_faults, storage_options: Mapping[str, Any] | None = None
    ) -> FileSinkCommitter:
        """``storage_options``: resolved by the runtime when ``storage_conn_id`` names a connection."""
        options = given_storage_options(
            self.storage_options, self.storage_conn_id, storage_options, what=f"sink {self.sink_id!r}"
        )
        from airflow_provider_exactly_once.sinks.files import FileSinkCommitter

        return FileSinkCommitter(self.root, storage_options=options, fault=fault)

    def write_folders(self, committer: SinkCommitter) -> WriteFolderListing:
        """Its staging folders as the orphan scan lists them, on the file system of its committer
        (``committer``'s own), the one its deletes use."""
        from airflow_provider_exactly_once.sinks.files import FileSinkCommitter
        from airflow_provider_exactly_once.sinks.write_locations import FileWriteFolders

        assert isinstance(committer, FileSinkCommitter), "the committer of this config (committer)"
        return FileWriteFolders(committer)


SinkConfig = IcebergSinkConfig | FileSinkConfig
_KINDS: dict[object, type[SinkConfig]] = {"iceberg": IcebergSinkConfig, "files": FileSinkConfig}


def sink_config_from_dict(data: Mapping[str, Any]) -> SinkConfig:
    """A registered sink config (its ``model_dump(mode="json")``) read back, refusing unknown kinds and
    fields by name; the flat upsert settings of a sink registered before ``upsert`` are read too."""
    kind = data.get("kind")
    if kind not in _KINDS:
        raise InvalidSinkConfig(f"sink configuration has unknown kind {kind!r}; expected 'iceberg' or 'files'")
    try:
        config: SinkConfig = _KINDS[kind].model_validate(data, context={_REGISTERED: True})
    except ValidationError as exc:
        raise config_refusal(exc, f"sink configuration {dict(data)!r}") from None
    return config
