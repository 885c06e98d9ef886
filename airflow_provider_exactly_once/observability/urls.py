"""Where the sink-state view lives, in one place: the plugin's FastAPI app, its UI entry and the
operators' extra links all build their URLs here, so a link can never point at a page that moved.

The FastAPI app is mounted by Airflow's API server under ``URL_PREFIX``; ``base_url`` is Airflow's
``[api] base_url`` (empty or ``http://host:port``), never a guess.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

#: Path under which the API server mounts the plugin's FastAPI app.
URL_PREFIX = "/exactly-once"
#: The ``url_route`` of the UI entry: the Airflow UI shows the view at ``/plugin/<route>``.
UI_ROUTE = "exactly-once"


def _join(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + path


def sinks_page(base_url: str = "", *, sink_id: str | None = None, status: str | None = None) -> str:
    """The list of sinks and epochs, optionally filtered by sink and status."""
    query = {k: v for k, v in (("sink", sink_id), ("status", status)) if v}
    return _join(base_url, f"{URL_PREFIX}/") + (f"?{urlencode(query)}" if query else "")


def epoch_page(sink_id: str, epoch: int, base_url: str = "") -> str:
    """One epoch: its row, its files and tables, the run and try that wrote it, its checkpoint."""
    return _join(base_url, f"{URL_PREFIX}/sinks/{quote(sink_id, safe='')}/epochs/{int(epoch)}")


def task_log(base_url: str, dag_id: str, run_id: str, task_id: str, try_number: int | None) -> str:
    """A task's log in the Airflow UI, as Airflow's own ``RuntimeTaskInstance.log_url`` builds it
    (the run id quoted, the try given when known): the page the views link a failed task to."""
    attempt = f"?try_number={int(try_number)}" if try_number is not None and try_number > 0 else ""
    return _join(base_url, f"/dags/{dag_id}/runs/{quote(run_id)}/tasks/{task_id}{attempt}")


def dag_run_api(base_url: str, dag_id: str, run_id: str) -> str:
    """A DAG run in Airflow's REST API: ``PATCH`` it with ``{"state": "failed"}`` to fail it."""
    return _join(base_url, f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}")
