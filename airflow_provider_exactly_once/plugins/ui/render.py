"""How the view shows what it read: Jinja filters, links, and errors as a page or as JSON.

An error answers in the form the request asked for: a page (a GET outside ``/api`` and
``/static``) gets the error page with the status code, the JSON API gets ``{"detail", "error"}``.
Every message is masked (``core.errors``) on its way out, whichever layer wrote it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import Request, status
from fastapi.responses import JSONResponse, Response
from fastapi.templating import Jinja2Templates

from airflow_provider_exactly_once.core.errors import mask_userinfo
from airflow_provider_exactly_once.observability import urls
from airflow_provider_exactly_once.runtime.run_epochs import instant_text, interval_text
from airflow_provider_exactly_once.version_compat import HTTP_422

log = logging.getLogger(__name__)

_TITLES = {
    status.HTTP_400_BAD_REQUEST: "Bad request",
    status.HTTP_403_FORBIDDEN: "Refused",
    status.HTTP_404_NOT_FOUND: "Not found",
    status.HTTP_409_CONFLICT: "Refused",
    HTTP_422: "Bad request",
    status.HTTP_503_SERVICE_UNAVAILABLE: "Unavailable",
}


def is_page(request: Request) -> bool:
    """Whether the request is for a page (answered with HTML) rather than the API or a static file."""
    root = str(request.scope.get("root_path", ""))
    return request.method == "GET" and not request.url.path.startswith((f"{root}/api", f"{root}/static"))


def error_response(
    request: Request, templates: Jinja2Templates, code: int, detail: Any, error: str | None = None
) -> Response:
    """The error page for a page, ``{"detail": ..., "error": ...}`` for the API; masked either way."""
    masked = _masked(detail)
    if is_page(request):
        message = masked if isinstance(masked, str) else "; ".join(_describe(item) for item in masked)
        return templates.TemplateResponse(
            request,
            "error.html",
            {
                "user": "",
                "title": _TITLES.get(code, "Error"),
                "message": message,
                "home": urls.sinks_page(base(request)),
            },
            status_code=code,
        )
    body: dict[str, Any] = {"detail": masked}
    if error:
        body["error"] = error
    return JSONResponse(body, status_code=code)


def _masked(value: Any) -> Any:
    if isinstance(value, str):
        return mask_userinfo(value)
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v) for v in value]
    return value


def _describe(item: Any) -> str:
    """One of FastAPI's validation errors as a sentence: ``query offset: Input should be ...``."""
    if not isinstance(item, dict):
        return str(item)
    where = " ".join(str(part) for part in item.get("loc", ()))
    return f"{where}: {item.get('msg', '')}".strip(": ")


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
    """An ISO 8601 time from a view's ``model_dump(mode="json")`` as ``2026-01-01 00:00:00 UTC`` (the view shows UTC only)."""
    if not iso:
        return ""
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _instant(iso: str | None) -> datetime | None:
    try:
        return None if not iso else datetime.fromisoformat(iso)
    except ValueError:
        return None


def format_instant(iso: str | None) -> str:
    """An ISO 8601 time as the task logs and ``eo-sink`` write data intervals: ``2024-05-31T00:00Z``."""
    moment = _instant(iso)
    return "" if moment is None else instant_text(moment)


def format_interval(start: str | None, end: str | None) -> str:
    """``[2024-05-31T00:00Z, 2024-06-01T00:00Z)``, as the task logs name an epoch (``...``: end unknown)."""
    begin = _instant(start)
    return "" if begin is None else interval_text(begin, _instant(end))


def format_size(size: int | None) -> str:
    if size is None:
        return ""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def text(value: object) -> str | None:
    if value is None:
        return None
    return str(getattr(value, "value", value))


def quoted(value: str) -> str:
    return quote(value, safe="")


def airflow_root(request: Request) -> str:
    """The Airflow UI's root path as this request sees it (the app's root path minus its prefix)."""
    root = str(request.scope.get("root_path", ""))
    return root[: -len(urls.URL_PREFIX)] if root.endswith(urls.URL_PREFIX) else root


def base(request: Request) -> str:
    """What goes before ``URL_PREFIX`` in links: the Airflow root path this request came through."""
    return airflow_root(request)


def dag_run_url(
    request: Request, dag_id: str | None, run_id: str | None, live: frozenset[tuple[str, str]]
) -> str | None:
    """The run's page in Airflow's UI, only for a run in ``live`` (``existing_runs``): a ``dags test``
    of the same date deletes the earlier run, and a link to it would open nothing."""
    if not dag_id or not run_id or (dag_id, run_id) not in live:
        return None
    return f"{airflow_root(request)}/dags/{quoted(dag_id)}/runs/{quoted(run_id)}"


def existing_runs(runs: Iterable[tuple[str | None, str | None]]) -> frozenset[tuple[str, str]]:
    """Which of these (DAG id, run id) runs Airflow's metadata database still holds.

    The view runs inside Airflow's API server, so it asks the database the server uses. When that
    cannot be asked, no run is linked (each is still shown by its id) rather than a link guessed.
    """
    wanted = sorted({(d, r) for d, r in runs if d and r})
    if not wanted:
        return frozenset()
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select, tuple_

        with create_session() as session:
            found = session.execute(
                select(DagRun.dag_id, DagRun.run_id).where(tuple_(DagRun.dag_id, DagRun.run_id).in_(wanted))
            ).all()
    except Exception as exc:  # the links are a convenience: the page is shown without them
        log.warning("sink-state view: cannot tell which DAG runs exist (%s); no run is linked", mask_userinfo(str(exc)))
        return frozenset()
    return frozenset((str(d), str(r)) for d, r in found)


def page_url(request: Request, sink: str | None, state: str | None, *, offset: int) -> str:
    url = urls.sinks_page(base(request), sink_id=sink, status=state or None)
    return url + (("&" if "?" in url else "?") + f"offset={offset}" if offset else "")


def templates_for(directory: str) -> Jinja2Templates:
    templates = Jinja2Templates(directory=directory)
    templates.env.filters["age"] = format_age
    templates.env.filters["filesize"] = format_size
    templates.env.filters["when"] = format_when
    templates.env.filters["instant"] = format_instant
    templates.env.filters["interval"] = format_interval
    return templates
