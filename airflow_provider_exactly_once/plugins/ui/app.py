"""The sink-state view: a FastAPI app that Airflow's API server mounts at ``urls.URL_PREFIX``.

A JSON API under ``/api`` and server-rendered pages (no JavaScript build, works in the Airflow UI's
iframe), both over ``SinkOperations``, so every action goes through the coordinator and the view
never writes the meta store or the sink itself. Blocking work runs in plain ``def`` handlers, in
FastAPI's thread pool, so a slow catalog never stalls the API server's event loop. See docs/ui.md.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from airflow.api_fastapi.auth.managers.models.base_user import BaseUser
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_provider_exactly_once.core.epochs import (
    ABORT_REASON_MAX_LENGTH,
    EPOCH_MAX,
    Actor,
    ActorKind,
    EpochStatus,
    abort_reason_fault,
    acting,
    check_epoch,
    check_sink_id,
)
from airflow_provider_exactly_once.core.errors import (
    AbortRefused,
    CheckpointNotReady,
    EpochAborted,
    EpochNotFound,
    ExactlyOnceError,
    InvalidPreCommit,
    InvalidSinkConfig,
    MetaStoreUnavailable,
    SinkUnavailable,
    StateConflict,
    mask_userinfo,
)
from airflow_provider_exactly_once.defaults import CONFIG_SECTION
from airflow_provider_exactly_once.observability import urls
from airflow_provider_exactly_once.operations import stale_runs
from airflow_provider_exactly_once.operations.reads import InvalidRequest
from airflow_provider_exactly_once.operations.views import RESERVED, EpochView, HistoryView, StaleRunView
from airflow_provider_exactly_once.plugins.ui import render
from airflow_provider_exactly_once.plugins.ui.epoch_chart import CHART_EPOCHS, epoch_chart
from airflow_provider_exactly_once.plugins.ui.security import (
    EDIT,
    READ,
    AccessChecker,
    current_user,
    login_url,
    require_same_origin_json,
    security_headers,
)
from airflow_provider_exactly_once.version_compat import HTTP_422

if TYPE_CHECKING:
    from airflow_provider_exactly_once.operations import SinkOperations

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent
#: ``[exactly_once] sink_listing``: ``per_dag`` (the default) lists a sink, with the counts of its
#: epochs, only to users who may read a DAG that wrote some of them; ``all`` lists every sink with
#: all its counts to any user who may read some DAG (docs/ui.md says when that is wanted).
SINK_LISTING_OPTION = "sink_listing"
SINK_LISTINGS = ("per_dag", "all")
#: Rows per page of the epoch list.
PAGE_SIZE = 100

OperationsFactory = Callable[[], "SinkOperations"]
#: The caller, as Airflow's auth resolves it (module level: FastAPI evaluates handler annotations here).
User = Annotated[BaseUser, Depends(current_user)]
#: An offset the meta store's 64-bit ``OFFSET`` can take.
Offset = Annotated[int, Query(ge=0, le=EPOCH_MAX)]


def default_operations() -> SinkOperations:
    """``SinkOperations`` on the meta store of ``[exactly_once] meta_conn_id`` (default connection)."""
    from airflow_provider_exactly_once.operations import SinkOperations
    from airflow_provider_exactly_once.runtime.assembly import meta_conn_id_or_configured, open_meta_store

    conn_id = meta_conn_id_or_configured(None)
    return SinkOperations(open_meta_store(conn_id), meta_conn_id=conn_id)


def sink_listing() -> str:
    """``[exactly_once] sink_listing``, refused by name when it is neither ``per_dag`` nor ``all``."""
    from airflow.configuration import conf

    value = str(conf.get(CONFIG_SECTION, SINK_LISTING_OPTION, fallback="per_dag") or "per_dag").strip().lower()
    if value not in SINK_LISTINGS:
        raise InvalidSinkConfig(f"[{CONFIG_SECTION}] {SINK_LISTING_OPTION} = {value!r}; one of {list(SINK_LISTINGS)}")
    return value


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


class ActionBody(BaseModel):
    """Strict booleans: ``"yes"`` or ``1`` for ``force`` is a mistake to point out, not a ``True``."""

    model_config = ConfigDict(extra="forbid")
    dry_run: StrictBool = False


class AbortBody(ActionBody):
    reason: str = Field(
        min_length=1, max_length=ABORT_REASON_MAX_LENGTH, description="Why the epoch is aborted; kept on the row."
    )
    force: StrictBool = False

    @field_validator("reason")
    @classmethod
    def _printable(cls, reason: str) -> str:
        if (fault := abort_reason_fault(reason)) is not None:
            raise ValueError(fault)
        return reason


#: Refusals of the core, by what they mean to a client of the view.
_ERROR_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (EpochNotFound, status.HTTP_404_NOT_FOUND),
    (InvalidRequest, HTTP_422),
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
        # Any other refusal of the core (missing data files, schema mismatch...) is a state the
        # epoch is in, not a fault of the request or of the view.
        return status.HTTP_409_CONFLICT
    return status.HTTP_500_INTERNAL_SERVER_ERROR


#: The statuses the epoch list filters by: a row's, and ``Reserved`` (a range reserved, no row yet).
STATUSES = (*(s.value for s in EpochStatus), RESERVED)


def _parse_status(value: str | None) -> str | None:
    if not value:
        return None
    for candidate in STATUSES:
        if value.lower() == candidate.lower():
            return candidate
    raise HTTPException(status.HTTP_400_BAD_REQUEST, f"unknown status {value!r}; one of {', '.join(STATUSES)}")


def stale_run_threshold() -> timedelta:
    """``[exactly_once] stale_run_minutes``, refused by name when it is no number of minutes > 0."""
    from airflow.configuration import conf

    return stale_runs.threshold_of(conf.get(CONFIG_SECTION, stale_runs.STALE_RUN_OPTION, fallback=None))


def _checked(sink_id: str, epoch: int) -> tuple[str, int]:
    """A sink id and epoch that could name a row; 422 naming the fault otherwise."""
    try:
        return check_sink_id(sink_id), check_epoch(epoch)
    except InvalidPreCommit as exc:
        raise HTTPException(HTTP_422, str(exc)) from None


def _not_found(sink_id: str, epoch: int) -> EpochNotFound:
    """The one answer to an epoch that does not exist and to one the user may not read: identical,
    so that probing tells nothing about which epochs (or DAGs) exist."""
    return EpochNotFound(f"sink {sink_id!r} epoch {epoch}: no such epoch, or not one this user may read")


def create_app(operations: OperationsFactory = default_operations) -> FastAPI:
    """The view's app; ``operations`` builds the ``SinkOperations`` it serves (tests pass their own)."""
    # The API docs are served below, behind the same authentication as the API itself.
    app = FastAPI(
        title="Exactly-once sinks",
        description="Sinks and epochs of the exactly-once provider, and the actions on them.",
        docs_url=None,
        openapi_url=None,
        redoc_url=None,
    )
    ops = _Lazy(operations)
    templates = render.templates_for(str(_HERE / "templates"))
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")

    @app.middleware("http")
    async def _guard(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        # A fault nobody foresaw: logged here, masked, and answered as a plain 500, so neither the
        # answer nor the server's own traceback can carry a location's credentials.
        try:
            return await security_headers(request, call_next)
        except Exception as exc:
            log.error("sink-state view: %s failed:\n%s", request.url.path, mask_userinfo(traceback.format_exc()))
            response = render.error_response(
                request, templates, status.HTTP_500_INTERNAL_SERVER_ERROR, f"internal error ({type(exc).__name__})"
            )
            return await security_headers(request, _answer(response))

    @app.exception_handler(ExactlyOnceError)
    async def _core_refusal(request: Request, error: ExactlyOnceError) -> Response:
        return render.error_response(request, templates, _http_status(error), str(error), type(error).__name__)

    @app.exception_handler(RequestValidationError)
    async def _malformed(request: Request, error: RequestValidationError) -> Response:
        # Only where and why: FastAPI's default also echoes the input, which may hold a secret.
        detail = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in error.errors()
        ]
        return render.error_response(request, templates, HTTP_422, detail)

    @app.exception_handler(StarletteHTTPException)
    async def _refused(request: Request, error: StarletteHTTPException) -> Response:
        # A page asked for without a credential goes to the login page; every other refusal of a
        # page is the error page, and of the API, JSON.
        if render.is_page(request) and error.status_code == status.HTTP_401_UNAUTHORIZED:
            return RedirectResponse(login_url(request), status_code=status.HTTP_303_SEE_OTHER)
        response = render.error_response(request, templates, error.status_code, error.detail)
        for name, value in (error.headers or {}).items():
            response.headers[name] = value
        return response

    # -- reading ------------------------------------------------------------------------------------

    def _visible_epochs(
        access: AccessChecker, sink: str | None, state: str | None, limit: int, offset: int
    ) -> list[dict[str, Any]]:
        access.require_some(READ)
        if sink:
            _checked(sink, 0)
        rows = ops.get().epochs(
            sink_id=sink or None, status=state, limit=limit, offset=offset, dag_ids=access.dag_ids(READ)
        )
        return [row.model_dump(mode="json") for row in rows]

    def _visible_sinks(access: AccessChecker) -> list[dict[str, Any]]:
        access.require_some(READ)
        dag_ids = None if sink_listing() == "all" else access.dag_ids(READ)
        return [sink.model_dump(mode="json") for sink in ops.get().sinks(dag_ids=dag_ids)]

    def _readable(access: AccessChecker, sink_id: str, epoch: int) -> str | None:
        """The epoch's DAG once the user may read it; else the answer a missing epoch gets. Only the
        row's DAG is looked up first: loading more of a hidden epoch would take measurably longer
        than finding none, and the time of the answer would tell that it exists."""
        try:
            dag_id = ops.get().dag_of(sink_id, epoch)
        except EpochNotFound:
            raise _not_found(sink_id, epoch) from None
        if not access.may_read(dag_id):
            raise _not_found(sink_id, epoch)
        return dag_id

    def _epoch_detail(request: Request, access: AccessChecker, sink_id: str, epoch: int) -> dict[str, Any]:
        """The epoch, its checkpoint, delivery and history; each failed task's log linked, of the runs
        Airflow still holds (``render.existing_runs``), as Airflow's UI at this request's root has it."""
        access.require_some(READ)
        sink_id, epoch = _checked(sink_id, epoch)
        _readable(access, sink_id, epoch)
        readable = access.dag_ids(READ)
        try:
            view = ops.get().epoch(sink_id, epoch, dag_ids=readable)
        except EpochNotFound:
            raise _not_found(sink_id, epoch) from None
        if not access.may_read(view.dag_id):  # another DAG's run re-wrote the epoch since the first look
            raise _not_found(sink_id, epoch)
        try:
            checkpoint = ops.get().checkpoint(sink_id, epoch)
            shown = {
                "status": render.text(checkpoint.status),
                "detail": checkpoint.detail,
                "source": checkpoint.source,
                "meaning": checkpoint.meaning,
            }
        except ExactlyOnceError as exc:  # an unregistered sink: its checkpoint source is unknown here
            shown = {"status": None, "detail": mask_userinfo(f"{type(exc).__name__}: {exc}"), "source": None}
        history = ops.get().history(sink_id, epoch, dag_ids=readable)
        view, history = _linked(request, view, history)
        return {
            "epoch": view.model_dump(mode="json"),
            "checkpoint": shown,
            # After the access checks: a hidden epoch's answer must not wait for its sink's catalog.
            "delivery": ops.get().delivery(sink_id).model_dump(mode="json"),
            "history": [e.model_dump(mode="json") for e in history],
            "can_edit": access.allowed(EDIT, view.dag_id),
        }

    @app.get("/api/openapi.json", include_in_schema=False)
    def api_openapi(request: Request, user: User) -> JSONResponse:
        # The paths are the app's own; the server URL makes "Try it out" reach them behind the mount.
        return JSONResponse({**app.openapi(), "servers": [{"url": str(request.scope.get("root_path", "")) or "/"}]})

    @app.get("/api/docs", response_class=HTMLResponse, include_in_schema=False)
    def api_docs(request: Request, user: User) -> Response:
        return templates.TemplateResponse(request, "docs.html", {"home": urls.sinks_page(render.base(request))})

    @app.get("/api/sinks", summary="The sinks and their epochs by status, of the DAGs the user may read")
    def api_sinks(user: User) -> list[dict[str, Any]]:
        return _visible_sinks(AccessChecker(user))

    @app.get("/api/epochs", summary="Epochs, newest first, of the DAGs the user may read")
    def api_epochs(
        user: User,
        sink: str | None = None,
        epoch_status: Annotated[str | None, Query(alias="status")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = PAGE_SIZE,
        offset: Offset = 0,
    ) -> list[dict[str, Any]]:
        return _visible_epochs(AccessChecker(user), sink, _parse_status(epoch_status), limit, offset)

    @app.get(
        "/api/sinks/{sink_id}/epochs/{epoch}",
        summary="One epoch, its checkpoint, how its sink's epochs reach its tables, and whether the user may act",
    )
    def api_epoch(request: Request, user: User, sink_id: str, epoch: int) -> dict[str, Any]:
        return _epoch_detail(request, AccessChecker(user), sink_id, epoch)

    # -- acting -------------------------------------------------------------------------------------

    def may_act(user: User) -> None:
        """Before the request's sink, epoch or body is looked at: a user who may edit no DAG learns
        nothing from an action, not even whether its arguments were well formed."""
        AccessChecker(user).require_some(EDIT)

    action_guards = [Depends(require_same_origin_json), Depends(may_act)]

    def _authorize_action(user: BaseUser, sink_id: str, epoch: int) -> tuple[str, int]:
        access = AccessChecker(user)
        sink_id, epoch = _checked(sink_id, epoch)
        access.require(EDIT, _readable(access, sink_id, epoch))
        return sink_id, epoch

    @app.post(
        "/api/sinks/{sink_id}/epochs/{epoch}/abort",
        summary="Abort a Pending epoch (refused once its commit was decided)",
        dependencies=action_guards,
    )
    def api_abort(user: User, sink_id: str, epoch: int, body: AbortBody) -> dict[str, Any]:
        sink_id, epoch = _authorize_action(user, sink_id, epoch)
        with acting(_ui_actor(user)):
            result = ops.get().abort(
                sink_id,
                epoch,
                reason=body.reason,
                by=f"{user.get_name()} in the sink-state view",
                force=body.force,
                dry_run=body.dry_run,
            )
        return result.model_dump(mode="json")

    @app.post(
        "/api/sinks/{sink_id}/epochs/{epoch}/reject",
        summary="Drop an audited epoch whose audit failed, and delete its files (design.md D23)",
        dependencies=action_guards,
    )
    def api_reject(user: User, sink_id: str, epoch: int, body: AbortBody) -> dict[str, Any]:
        sink_id, epoch = _authorize_action(user, sink_id, epoch)
        with acting(_ui_actor(user)):
            result = ops.get().reject(
                sink_id, epoch, reason=body.reason, by=f"{user.get_name()} in the sink-state view", dry_run=body.dry_run
            )
        return result.model_dump(mode="json")

    @app.post(
        "/api/sinks/{sink_id}/epochs/{epoch}/commit",
        summary="Retry the commit of a Pending epoch whose checkpoint completed",
        dependencies=action_guards,
    )
    def api_commit(user: User, sink_id: str, epoch: int, body: ActionBody) -> dict[str, Any]:
        sink_id, epoch = _authorize_action(user, sink_id, epoch)
        with acting(_ui_actor(user)):
            return ops.get().commit(sink_id, epoch, dry_run=body.dry_run).model_dump(mode="json")

    @app.post(
        "/api/sinks/{sink_id}/epochs/{epoch}/cleanup",
        summary="Run the clean-up of an Aborted epoch's files again",
        dependencies=action_guards,
    )
    def api_cleanup(user: User, sink_id: str, epoch: int, body: ActionBody) -> dict[str, Any]:
        sink_id, epoch = _authorize_action(user, sink_id, epoch)
        with acting(_ui_actor(user)):
            return ops.get().cleanup(sink_id, epoch, dry_run=body.dry_run).model_dump(mode="json")

    # -- pages --------------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def sinks_page(
        request: Request,
        user: User,
        sink: str | None = None,
        epoch_status: Annotated[str | None, Query(alias="status")] = None,
        offset: Offset = 0,
    ) -> Response:
        access = AccessChecker(user)
        state = _parse_status(epoch_status)
        sinks = _visible_sinks(access)
        # One sink's newest epochs, whatever their status, are also drawn: more of them than a page.
        charted = bool(sink) and state is None and offset == 0
        rows = _visible_epochs(access, sink, state, max(PAGE_SIZE + 1, CHART_EPOCHS if charted else 0), offset)
        check = stale_runs.check(ops.get(), stale_run_threshold(), sink_id=sink or None, dag_ids=access.dag_ids(READ))
        more = len(rows) > PAGE_SIZE
        epochs = rows[:PAGE_SIZE]
        for row in rows:
            row["url"] = urls.epoch_page(row["sink_id"], row["epoch"], render.base(request))
        live = render.existing_runs((row.get("dag_id"), row.get("run_id")) for row in epochs)
        for row in epochs:
            row["run_url"] = render.dag_run_url(request, row.get("dag_id"), row.get("run_id"), live)
            row["checkpoint"] = _checkpoint_text(row) if row["status"] == EpochStatus.PENDING.value else None
        return templates.TemplateResponse(
            request,
            "sinks.html",
            {
                "user": user.get_name(),
                "sinks": sinks,
                "epochs": epochs,
                "chart": epoch_chart(rows) if charted else None,
                "sink": sink or "",
                "status": state or "",
                "statuses": [s.value for s in EpochStatus],
                "filter_statuses": STATUSES,
                "stale_runs": [_stale(request, run) for run in check.stale],
                "runs_not_checked": check.not_checked,
                "offset": offset,
                "page_size": PAGE_SIZE,
                "more": more,
                "home": urls.sinks_page(render.base(request)),
                "page_url": lambda **kw: render.page_url(request, sink, state, **kw),
            },
        )

    def _checkpoint_text(row: dict[str, Any]) -> str:
        try:
            return render.text(ops.get().checkpoint(row["sink_id"], row["epoch"]).status) or "unknown"
        except ExactlyOnceError as error:
            return f"unknown ({type(error).__name__})"

    @app.get("/sinks/{sink_id}/epochs/{epoch}", response_class=HTMLResponse, include_in_schema=False)
    def epoch_page(request: Request, user: User, sink_id: str, epoch: int) -> Response:
        detail = _epoch_detail(request, AccessChecker(user), sink_id, epoch)
        row = detail["epoch"]
        live = render.existing_runs(
            [(row.get("dag_id"), row.get("run_id")), *((r.get("dag_id"), r.get("run_id")) for r in row["revisions"])]
        )
        for revision in row["revisions"]:
            revision["run_url"] = render.dag_run_url(request, revision.get("dag_id"), revision.get("run_id"), live)
        for later in (row.get("reservation") or {}).get("read_again_by", ()):
            later["url"] = urls.epoch_page(row["sink_id"], later["epoch"], render.base(request))
        return templates.TemplateResponse(
            request,
            "epoch.html",
            {
                "user": user.get_name(),
                "row": row,
                "checkpoint": detail["checkpoint"],
                "delivery": detail["delivery"],
                "history": detail["history"],
                "can_edit": detail["can_edit"],
                "run_url": render.dag_run_url(request, row.get("dag_id"), row.get("run_id"), live),
                "home": urls.sinks_page(render.base(request)),
                "sink_url": urls.sinks_page(render.base(request), sink_id=row["sink_id"]),
                "api": f"{render.base(request)}{urls.URL_PREFIX}/api/sinks/{render.quoted(row['sink_id'])}"
                f"/epochs/{int(row['epoch'])}",
            },
        )

    return app


def _linked(request: Request, view: EpochView, history: list[HistoryView]) -> tuple[EpochView, list[HistoryView]]:
    """The epoch's cause and its history's failed tasks with their logs in Airflow's UI, for the
    runs Airflow still holds (a log of a run ``dags test`` deleted would open nothing)."""
    runs = [(e.dag_id, e.run_id) for e in history if e.step]
    if view.cause is not None:
        runs.append((view.cause.dag_id, view.cause.run_id))
    live = render.existing_runs(runs)
    root = render.airflow_root(request)
    return view.linked(root, live), [e.linked(root, live) for e in history]


def _stale(request: Request, run: StaleRunView) -> dict[str, Any]:
    """A run that will never finish, for the sink page: what to do, with the run's page (its
    "Mark as failed") and the epoch's."""
    root = render.airflow_root(request)
    return {
        **run.model_dump(mode="json", context={"base_url": root}),
        "run_url": f"{root}/dags/{render.quoted(run.dag_id)}/runs/{render.quoted(run.run_id)}",
        "epoch_url": urls.epoch_page(run.sink_id, run.epoch, render.base(request)),
    }


def _ui_actor(user: BaseUser) -> Actor:
    """The epochs' history names a sink-view action's user (``core.epochs``)."""
    return Actor(ActorKind.UI, name=str(user.get_name()))


def _answer(response: Response) -> Callable[[Request], Awaitable[Response]]:
    async def call_next(request: Request) -> Response:
        return response

    return call_next
