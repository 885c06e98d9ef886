"""The sink-state view: a FastAPI app that Airflow's API server mounts at ``urls.URL_PREFIX``.

Two faces over the same ``SinkOperations``: a JSON API under ``/api`` (for scripts and the page's
buttons) and server-rendered pages (so the view needs no JavaScript build and works inside the
Airflow UI's iframe). Every action goes through ``SinkOperations`` and so through the coordinator,
under the same invariants as the DAGs: the view never writes the meta store or the sink itself.

Blocking work (the meta store, the catalog) runs in plain ``def`` handlers, which FastAPI runs in
its thread pool, so a slow catalog never stalls the API server's event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, ConfigDict, Field

from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointNotReady,
    EpochAborted,
    EpochNotFound,
    ExactlyOnceError,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    SinkUnavailable,
    StateConflict,
)
from airflow_provider_exactly_once.core.status import EpochStatus
from airflow_provider_exactly_once.plugins import urls
from airflow_provider_exactly_once.plugins.ui.security import (
    EDIT,
    READ,
    AccessChecker,
    current_user,
    login_url,
    require_same_origin_json,
)

if TYPE_CHECKING:
    from airflow_provider_exactly_once.operations import SinkOperations

_HERE = Path(__file__).parent
#: The meta store connection the view reads: ``[exactly_once] meta_conn_id``, else the default.
CONFIG_SECTION = "exactly_once"
#: Rows per page of the epoch list.
PAGE_SIZE = 100

OperationsFactory = Callable[[], "SinkOperations"]
#: The caller, as Airflow's auth resolves it (module level: FastAPI evaluates handler annotations here).
User = Annotated[BaseUser, Depends(current_user)]


def default_operations() -> SinkOperations:
    """``SinkOperations`` on the meta store of ``[exactly_once] meta_conn_id`` (default connection)."""
    from airflow.configuration import conf

    from airflow_provider_exactly_once.hooks.meta_store import DEFAULT_META_CONN_ID, ExactlyOnceMetaStoreHook
    from airflow_provider_exactly_once.operations import SinkOperations

    conn_id = str(conf.get(CONFIG_SECTION, "meta_conn_id", fallback=DEFAULT_META_CONN_ID) or DEFAULT_META_CONN_ID)
    return SinkOperations(ExactlyOnceMetaStoreHook(conn_id).get_store(), meta_conn_id=conn_id)


class _Lazy:
    """One ``SinkOperations`` per app, built on first use: the API server imports plugins at start,
    before a meta store connection need be reachable, and one unreachable store must not stop it."""

    def __init__(self, factory: OperationsFactory) -> None:
        self._factory = factory
        self._ops: SinkOperations | None = None
        self._lock = threading.Lock()

    def get(self) -> SinkOperations:
        with self._lock:
            if self._ops is None:
                self._ops = self._factory()
            return self._ops


class AbortBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=2000, description="Why the epoch is aborted; kept on the row.")
    force: bool = False
    dry_run: bool = False


class ActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dry_run: bool = False


#: Refusals of the core, by what they mean to a client of the view.
_ERROR_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (EpochNotFound, status.HTTP_404_NOT_FOUND),
    (AbortRefused, status.HTTP_409_CONFLICT),
    (CheckpointNotReady, status.HTTP_409_CONFLICT),
    (EpochAborted, status.HTTP_409_CONFLICT),
    (StateConflict, status.HTTP_409_CONFLICT),
    (InvalidSinkConfig, status.HTTP_400_BAD_REQUEST),
    (MetaStoreUnavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
    (SinkUnavailable, status.HTTP_503_SERVICE_UNAVAILABLE),
)


def _http_status(error: Exception) -> int:
    for kind, code in _ERROR_STATUS:
        if isinstance(error, kind):
            return code
    if isinstance(error, ExactlyOnceError):
        # Any other refusal of the core (missing data files, schema mismatch, an unreachable
        # sink...) is a state the epoch is in, not a fault of the request or of the view.
        return status.HTTP_409_CONFLICT
    return status.HTTP_500_INTERNAL_SERVER_ERROR


def _parse_status(value: str | None) -> EpochStatus | None:
    if not value:
        return None
    for candidate in EpochStatus:
        if value.lower() == candidate.value.lower():
            return candidate
    allowed = ", ".join(s.value for s in EpochStatus)
    raise HTTPException(status.HTTP_400_BAD_REQUEST, f"unknown status {value!r}; one of {allowed}")


def _airflow_root(request: Request) -> str:
    """The Airflow UI's root path as this request sees it (the app's root path minus its prefix)."""
    root = str(request.scope.get("root_path", ""))
    return root[: -len(urls.URL_PREFIX)] if root.endswith(urls.URL_PREFIX) else root


def dag_run_url(request: Request, dag_id: str | None, run_id: str | None) -> str | None:
    from urllib.parse import quote

    if not dag_id or not run_id:
        return None
    return f"{_airflow_root(request)}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def create_app(operations: OperationsFactory = default_operations) -> FastAPI:
    """The view's app; ``operations`` builds the ``SinkOperations`` it serves (tests pass their own)."""
    app = FastAPI(
        title="Exactly-once sinks",
        description="Sinks and epochs of the exactly-once provider, and the actions on them.",
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
    )
    ops = _Lazy(operations)
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.filters["age"] = format_age
    templates.env.filters["filesize"] = format_size
    templates.env.filters["when"] = format_when
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")

    @app.exception_handler(ExactlyOnceError)
    async def _core_refusal(request: Request, error: ExactlyOnceError) -> JSONResponse:
        return JSONResponse({"detail": str(error), "error": type(error).__name__}, status_code=_http_status(error))

    @app.exception_handler(HTTPException)
    async def _page_login(request: Request, error: HTTPException) -> Response:
        # A page asked for without a credential goes to the login page, and a refused page says why
        # in the page; the JSON API (and the static files) answer with the status and the detail.
        root = str(request.scope.get("root_path", ""))
        is_page = request.method == "GET" and not request.url.path.startswith((f"{root}/api", f"{root}/static"))
        if is_page and error.status_code == status.HTTP_401_UNAUTHORIZED:
            return RedirectResponse(login_url(request), status_code=status.HTTP_303_SEE_OTHER)
        if is_page and error.status_code in (status.HTTP_400_BAD_REQUEST, status.HTTP_403_FORBIDDEN):
            return templates.TemplateResponse(
                request,
                "error.html",
                {"user": "", "title": "Refused", "message": str(error.detail), "home": urls.sinks_page(_base(request))},
                status_code=error.status_code,
            )
        return await http_exception_handler(request, error)

    # -- reading ------------------------------------------------------------------------------------

    def _visible_epochs(
        access: AccessChecker, sink: str | None, state: EpochStatus | None, limit: int, offset: int
    ) -> list[dict[str, Any]]:
        rows = ops.get().epochs(sink_id=sink or None, status=state, limit=limit, offset=offset)
        return [row.to_dict() for row in rows if access.allowed(READ, row.dag_id)]

    def _visible_sinks(access: AccessChecker) -> list[dict[str, Any]]:
        # A sink is shown to whoever may read DAGs: its summary is counts, no run's data.
        access.require(READ, None)
        return [sink.to_dict() for sink in ops.get().sinks()]

    def _epoch_detail(access: AccessChecker, sink_id: str, epoch: int) -> dict[str, Any]:
        view = ops.get().epoch(sink_id, epoch)
        access.require(READ, view.dag_id)
        checkpoint = ops.get().checkpoint(sink_id, epoch)
        return {
            "epoch": view.to_dict(),
            "checkpoint": {"status": _text(checkpoint.status), "detail": checkpoint.detail},
            "can_edit": access.allowed(EDIT, view.dag_id),
        }

    @app.get("/api/sinks", summary="The registered sinks and their epochs by status")
    def api_sinks(user: User) -> list[dict[str, Any]]:
        return _visible_sinks(AccessChecker(user))

    @app.get("/api/epochs", summary="Epochs, newest first, of the DAGs the user may read")
    def api_epochs(
        user: User,
        sink: str | None = None,
        epoch_status: Annotated[str | None, Query(alias="status")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = PAGE_SIZE,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> list[dict[str, Any]]:
        return _visible_epochs(AccessChecker(user), sink, _parse_status(epoch_status), limit, offset)

    @app.get("/api/sinks/{sink_id}/epochs/{epoch}", summary="One epoch, its checkpoint and whether the user may act")
    def api_epoch(user: User, sink_id: str, epoch: int) -> dict[str, Any]:
        return _epoch_detail(AccessChecker(user), sink_id, epoch)

    # -- acting -------------------------------------------------------------------------------------

    def _authorize_action(user: BaseUser, sink_id: str, epoch: int) -> None:
        # The epoch's DAG decides; an unknown epoch is 404 only to those who may edit DAGs at all,
        # so a reader cannot probe for rows through the actions.
        access = AccessChecker(user)
        try:
            dag_id = ops.get().epoch(sink_id, epoch).dag_id
        except EpochNotFound:
            access.require(EDIT, None)
            raise
        access.require(EDIT, dag_id)

    @app.post(
        "/api/sinks/{sink_id}/epochs/{epoch}/abort",
        summary="Abort a Pending epoch (refused once its commit was decided)",
        dependencies=[Depends(require_same_origin_json)],
    )
    def api_abort(user: User, sink_id: str, epoch: int, body: AbortBody) -> dict[str, Any]:
        _authorize_action(user, sink_id, epoch)
        reason = f"{body.reason} (by {user.get_name()} in the sink-state view)"
        result = ops.get().abort(sink_id, epoch, reason=reason, force=body.force, dry_run=body.dry_run)
        return result.to_dict()

    @app.post(
        "/api/sinks/{sink_id}/epochs/{epoch}/commit",
        summary="Retry the commit of a Pending epoch whose checkpoint completed",
        dependencies=[Depends(require_same_origin_json)],
    )
    def api_commit(user: User, sink_id: str, epoch: int, body: ActionBody) -> dict[str, Any]:
        _authorize_action(user, sink_id, epoch)
        return ops.get().commit(sink_id, epoch, dry_run=body.dry_run).to_dict()

    @app.post(
        "/api/sinks/{sink_id}/epochs/{epoch}/cleanup",
        summary="Run the clean-up of an Aborted epoch's files again",
        dependencies=[Depends(require_same_origin_json)],
    )
    def api_cleanup(user: User, sink_id: str, epoch: int, body: ActionBody) -> dict[str, Any]:
        _authorize_action(user, sink_id, epoch)
        return ops.get().cleanup(sink_id, epoch, dry_run=body.dry_run).to_dict()

    # -- pages --------------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def sinks_page(
        request: Request,
        user: User,
        sink: str | None = None,
        epoch_status: Annotated[str | None, Query(alias="status")] = None,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> Response:
        access = AccessChecker(user)
        state = _parse_status(epoch_status)
        sinks = _visible_sinks(access)
        epochs = _visible_epochs(access, sink, state, PAGE_SIZE + 1, offset)
        more = len(epochs) > PAGE_SIZE
        epochs = epochs[:PAGE_SIZE]
        for row in epochs:
            row["url"] = urls.epoch_page(row["sink_id"], row["epoch"], _base(request))
            row["run_url"] = dag_run_url(request, row.get("dag_id"), row.get("run_id"))
            row["checkpoint"] = _checkpoint_text(row) if row["status"] == EpochStatus.PENDING.value else None
        return templates.TemplateResponse(
            request,
            "sinks.html",
            {
                "user": user.get_name(),
                "sinks": sinks,
                "epochs": epochs,
                "sink": sink or "",
                "status": state.value if state else "",
                "statuses": [s.value for s in EpochStatus],
                "offset": offset,
                "page_size": PAGE_SIZE,
                "more": more,
                "home": urls.sinks_page(_base(request)),
                "page_url": lambda **kw: _page_url(request, sink, state, **kw),
            },
        )

    def _checkpoint_text(row: dict[str, Any]) -> str:
        try:
            return _text(ops.get().checkpoint(row["sink_id"], row["epoch"]).status) or "unknown"
        except ExactlyOnceError as error:
            return f"unknown ({type(error).__name__})"

    @app.get("/sinks/{sink_id}/epochs/{epoch}", response_class=HTMLResponse, include_in_schema=False)
    def epoch_page(request: Request, user: User, sink_id: str, epoch: int) -> Response:
        try:
            detail = _epoch_detail(AccessChecker(user), sink_id, epoch)
        except EpochNotFound as error:
            return templates.TemplateResponse(
                request,
                "error.html",
                {
                    "user": user.get_name(),
                    "title": "Not found",
                    "message": str(error),
                    "home": urls.sinks_page(_base(request)),
                },
                status_code=status.HTTP_404_NOT_FOUND,
            )
        row = detail["epoch"]
        return templates.TemplateResponse(
            request,
            "epoch.html",
            {
                "user": user.get_name(),
                "row": row,
                "checkpoint": detail["checkpoint"],
                "can_edit": detail["can_edit"],
                "run_url": dag_run_url(request, row.get("dag_id"), row.get("run_id")),
                "home": urls.sinks_page(_base(request)),
                "sink_url": urls.sinks_page(_base(request), sink_id=sink_id),
                "api": f"{_base(request)}{urls.URL_PREFIX}/api/sinks/{_quote(sink_id)}/epochs/{int(epoch)}",
            },
        )

    return app


def format_age(seconds: float | None) -> str:
    """``age_seconds`` as a person reads it: the largest unit and the next one."""
    if seconds is None:
        return ""
    left = max(int(seconds), 0)
    units = (("d", 86_400), ("h", 3_600), ("min", 60), ("s", 1))
    for i, (unit, size) in enumerate(units):
        if left >= size or unit == "s":
            text = f"{left // size} {unit}"
            if i + 1 < len(units) and (rest := (left % size) // units[i + 1][1]):
                text += f" {rest} {units[i + 1][0]}"
            return text
    return ""


def format_when(iso: str | None) -> str:
    """An ISO 8601 time from ``to_dict()`` as ``2026-01-01 00:00:00 UTC`` (the view shows UTC only)."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def format_size(size: int | None) -> str:
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def _text(value: object) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


def _quote(value: str) -> str:
    from urllib.parse import quote

    return quote(value, safe="")


def _base(request: Request) -> str:
    """What goes before ``URL_PREFIX`` in links: the Airflow root path this request came through."""
    return _airflow_root(request)


def _page_url(request: Request, sink: str | None, state: EpochStatus | None, *, offset: int) -> str:
    url = urls.sinks_page(_base(request), sink_id=sink, status=state.value if state else None)
    return url + (("&" if "?" in url else "?") + f"offset={offset}" if offset else "")
