"""Who may read and act on the sink-state view: Airflow's own auth manager decides, per DAG.

The view adds no user model of its own. The caller is resolved by Airflow's ``get_user`` (the JWT
from the ``Authorization: Bearer`` header, else the ``_token`` cookie the Airflow UI sets), and every
decision is the configured auth manager's ``is_authorized_dag``: reading an epoch is reading the DAG
that wrote it, acting on it (abort, commit, clean-up) is editing that DAG. An epoch written outside
any DAG (no ``dag_id`` on its row) needs the same access to DAGs in general.

Actions are POSTs that change the meta store and the sink, and the UI authenticates them with a
cookie, so they must not be forgeable by another site: the cookie is ``SameSite=Lax`` (Airflow sets
it), the body must be JSON (a cross-site form cannot send that without a CORS preflight, which this
app never answers), and a request whose ``Origin`` or ``Sec-Fetch-Site`` says it came from elsewhere
is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fastapi import HTTPException, Request, status

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
