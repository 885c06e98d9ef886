"""The "Epoch" extra link of the commit and abort tasks: from a task instance to its epoch's page.

Airflow 3 resolves an operator link in the worker when the task finishes (``get_link`` runs there
and its URL is stored as an XCom the API server reads back), so the link is computed from what the
task itself returned: its XCom names the sink and the epoch it worked on. A task that failed before
it knew its epoch has no link (Airflow shows none for an empty URL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink

from airflow_provider_exactly_once.observability.urls import epoch_page

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


def api_base_url() -> str:
    """Airflow's ``[api] base_url``: where the API server, and so the plugin's pages, are reached."""
    from airflow_provider_exactly_once.version_compat import conf

    return str(conf.get("api", "base_url", fallback="") or "")


def epoch_url(summary: Any, base_url: str | None = None) -> str:
    """The epoch page for a commit or abort task's return value; empty when it names no epoch."""
    if not isinstance(summary, dict):
        return ""
    sink_id, epoch = summary.get("sink_id"), summary.get("epoch")
    if not isinstance(sink_id, str) or not sink_id or isinstance(epoch, bool) or not isinstance(epoch, int):
        return ""
    return epoch_page(sink_id, epoch, api_base_url() if base_url is None else base_url)


class EpochLink(BaseOperatorLink):
    """Opens the epoch the task committed or aborted in the provider's sink-state view."""

    name = "Epoch"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        return epoch_url(XCom.get_value(ti_key=ti_key, key="return_value"))
