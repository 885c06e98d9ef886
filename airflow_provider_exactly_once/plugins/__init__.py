"""The provider's Airflow plugin: a listener that starts the recovery DAG when the scheduler starts,
and the sink-state view (``plugins/ui``) served by the API server and listed in the UI's Browse menu.

A crash that took the scheduler down usually left epochs half done; waiting for the recovery DAG's
next scheduled run would leave them so for up to a whole schedule interval. Registered through the
provider info's ``plugins`` (loaded when ``[core] lazy_discover_providers`` is off) and, where the
package declares it, the ``airflow.plugins`` entry point.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_exactly_once.observability import urls
from airflow_provider_exactly_once.plugins.listener import RecoveryOnSchedulerStart
from airflow_provider_exactly_once.plugins.ui import SinkStateApp

recovery_listener = RecoveryOnSchedulerStart()
sink_state_app = SinkStateApp()


class ExactlyOncePlugin(AirflowPlugin):
    name = "exactly_once"
    listeners = [recovery_listener]  # noqa: RUF012 - AirflowPlugin declares it as a class attribute
    # The sink-state view: its FastAPI app, mounted by the API server, and its entry in the UI's
    # Browse menu (the UI shows ``href`` in a frame at ``/plugin/<url_route>``).
    fastapi_apps = [{"app": sink_state_app, "url_prefix": urls.URL_PREFIX, "name": "Exactly-once sinks"}]  # noqa: RUF012
    external_views = [  # noqa: RUF012
        {
            "name": "Exactly-once sinks",
            "href": urls.sinks_page(),
            "url_route": urls.UI_ROUTE,
            "destination": "nav",
            "category": "browse",
        }
    ]


__all__ = ["ExactlyOncePlugin", "RecoveryOnSchedulerStart", "recovery_listener", "sink_state_app"]
