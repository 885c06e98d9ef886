"""Every use of another project's private parts, fenced in one module beside ``version_compat``.

Each may change in any upstream release, so each is taken here only and
``tests/test_upstream_private.py`` asserts it as the installed upstream has it; pyiceberg's stay in
``sinks/iceberg/transaction.py`` (design.md, "Use, do not rewrite"). Nothing is imported at module
level, so the Spark driver and a DAG parse import neither Airflow's ORM nor the Spark provider.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any


def executor_safeguard_tracker() -> ContextVar[Any] | None:
    """The Task SDK's ``ExecutorSafeguard.tracker``: the context variable naming the operator whose
    ``execute`` its runner is calling, or ``None`` where the SDK guards differently (or not at all).

    Setting it around a nested ``execute`` is how ``operators._common.execute_nested`` tells the
    guard the call is meant; the SDK offers no public way to say so.
    """
    try:
        from airflow.sdk.bases.operator import ExecutorSafeguard
    except ImportError:  # pragma: no cover - an SDK without the guard
        return None
    tracker = getattr(ExecutorSafeguard, "tracker", None)
    return tracker if isinstance(tracker, ContextVar) else None


def spark_binary_of(submit: Any) -> str:
    """The ``spark-submit`` binary a ``SparkSubmitOperator`` will run, as its hook resolved it from
    the connection (``SparkSubmitHook._connection["spark_binary"]``): the provider makes this
    choice in a private method and exposes no accessor, and checking the binary before submitting
    turns a missing one into a clear refusal instead of a bare ``FileNotFoundError``."""
    return str(submit._get_hook()._connection["spark_binary"])


@contextmanager
def airflow_model_import_set_aside() -> Iterator[None]:
    """While inside, Airflow's listener that imports every Airflow model at the first SQLAlchemy
    mapper configuration (``airflow.utils.orm_event_handlers.setup_event_handlers`` listens with
    ``airflow.models.import_all_models``) is removed; it is put back on leaving, so the first
    configuration of Airflow's own mappers imports them as before. Where the listener is not
    registered (no ORM set up, or an Airflow that does it otherwise), nothing is changed."""
    from airflow.models import import_all_models
    from sqlalchemy import event
    from sqlalchemy.orm import Mapper

    if not event.contains(Mapper, "before_configured", import_all_models):
        yield
        return
    event.remove(Mapper, "before_configured", import_all_models)
    try:
        yield
    finally:
        event.listen(Mapper, "before_configured", import_all_models, once=True)


#: The Task SDK's switch between its secrets chains (``ensure_secrets_backend_loaded``).
AIRFLOW_PROCESS_CONTEXT = "_AIRFLOW_PROCESS_CONTEXT"


@contextmanager
def as_airflow_server_process() -> Iterator[None]:
    """While inside, connections resolve as in Airflow's server processes: secrets backend, then
    ``AIRFLOW_CONN_*``, then Airflow's database. Outside a task and without this, the Task SDK reads
    only the first two, so an ``eo-sink`` run on an Airflow machine would not see a connection made
    in the UI (and fall back to the embedded store without a word). ``airflow connections get``
    sets the same variable for the same reason; a value already set is left as it is."""
    import os

    before = os.environ.get(AIRFLOW_PROCESS_CONTEXT)
    if before is None:
        os.environ[AIRFLOW_PROCESS_CONTEXT] = "server"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(AIRFLOW_PROCESS_CONTEXT, None)
