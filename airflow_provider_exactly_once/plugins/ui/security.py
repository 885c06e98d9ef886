"""Who may read and act on the sink-state view: Airflow's own auth manager decides, per DAG.

The view adds no user model of its own: reading an epoch is reading the DAG that wrote it, acting on
it is editing that DAG, and an epoch a user may not read answers as a missing one does. Actions are
cookie-authenticated POSTs, so they must be JSON and come from the same site. The rules, redaction
of another DAG's traces included: docs/ui.md and design.md D7.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, Response, status

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

#: ``ResourceMethod`` of reading and of editing a DAG, as Airflow's own routes use them.
READ = "GET"
EDIT = "PUT"


class AccessChecker:
    """Answers "may this user do this to the DAG of this epoch?", once per DAG per request."""

    def __init__(self, user: BaseUser) -> None:
        self.user = user
        self._cache: dict[tuple[str, str | None], bool] = {}
        self._dag_ids: dict[str, frozenset[str] | None] = {}

    def dag_ids(self, method: str) -> frozenset[str] | None:
        """``None`` when the user may do ``method`` to every DAG, else the DAG ids they may (asked once)."""
        if method not in self._dag_ids:
            self._dag_ids[method] = None if self.allowed(method, None) else _authorized_dag_ids(method, self.user)
        return self._dag_ids[method]

    def may_read(self, dag_id: str | None) -> bool:
        """Whether the epoch of this DAG is visible: the same rule as the listing's query."""
        readable = self.dag_ids(READ)
        return readable is None or (dag_id is not None and dag_id in readable)

    def require_some(self, method: str) -> None:
        """Refuse a user who may not do ``method`` to any DAG, before anything about an epoch is looked at."""
        scope = self.dag_ids(method)
        if scope is not None and not scope:
            what = "read" if method == READ else "edit"
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"Forbidden: this user may not {what} any DAG")

    def allowed(self, method: str, dag_id: str | None) -> bool:
        key = (method, dag_id)
        if key not in self._cache:
            self._cache[key] = _is_authorized_dag(method, dag_id, self.user)
        return self._cache[key]

    def require(self, method: str, dag_id: str | None) -> None:
        if not self.allowed(method, dag_id):
            what = "read" if method == READ else "edit"
            target = f"DAG {dag_id!r}" if dag_id else "DAGs"
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"Forbidden: this user may not {what} {target}")


def _is_authorized_dag(method: str, dag_id: str | None, user: BaseUser) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    from airflow.models.dag import DagModel

    # The DAG's team scopes access in multi-team deployments, exactly as ``requires_access_dag``
    # resolves it; a DAG Airflow does not know has no team.
    team_name = DagModel.get_team_name(dag_id) if dag_id else None
    manager: Any = get_auth_manager()
    return bool(manager.is_authorized_dag(method=method, details=DagDetails(id=dag_id, team_name=team_name), user=user))


def _authorized_dag_ids(method: str, user: BaseUser) -> frozenset[str]:
    from airflow.api_fastapi.app import get_auth_manager

    manager: Any = get_auth_manager()
    return frozenset(manager.get_authorized_dag_ids(user=user, method=method))


async def current_user(request: Request) -> BaseUser:
    """Airflow's own resolution of the caller; 401 without a credential, 403 for a bad token."""
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    credentials = await bearer_scheme(request)
    user: BaseUser = await get_user(request, None, credentials)
    return user


def login_url(request: Request) -> str:
    """The auth manager's login page, coming back to the page asked for."""
    from airflow.api_fastapi.app import get_auth_manager

    return str(get_auth_manager().get_url_login(next_url=str(request.url)))


def require_same_origin_json(request: Request) -> None:
    """Refuse an action request that another site could have forged (see the module docstring)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json":
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            f"actions take a JSON body (Content-Type: application/json), got {content_type or 'none'!r}",
        )
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"cross-site action refused (Sec-Fetch-Site: {fetch_site})")
    origin = request.headers.get("origin")
    # Host and port only: a TLS-terminating proxy in front of the API server changes the scheme.
    if origin is not None and urlsplit(origin).netloc != request.url.netloc:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"cross-origin action refused (Origin: {origin})")


#: The view's pages load their script and style from ``static/`` only: no inline script can run,
#: whatever a stored text manages to put into a page. ``frame-ancestors 'self'``: the Airflow UI
#: shows the view in a frame of its own origin, and no other site may.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
)
#: The API docs page runs Swagger UI from its CDN (as FastAPI's own docs do), started by ``static/docs.js``.
SWAGGER_CDN = "https://cdn.jsdelivr.net"
DOCS_CSP = (
    f"default-src 'self'; script-src 'self' {SWAGGER_CDN}; style-src 'self' {SWAGGER_CDN} 'unsafe-inline'; "
    f"img-src 'self' data: {SWAGGER_CDN}; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'self'"
)


async def security_headers(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Every answer of the view: no sniffing, no framing by other sites, no inline script on its pages."""
    response = await call_next(request)
    docs = request.url.path.endswith("/api/docs")
    response.headers.setdefault("Content-Security-Policy", DOCS_CSP if docs else PAGE_CSP)
    response.headers.setdefault("X-Frame-Options", "SAMEORIGIN")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response
