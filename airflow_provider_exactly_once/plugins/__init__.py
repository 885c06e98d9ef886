"""The provider's Airflow plugin: a listener that starts the recovery DAG when the scheduler starts.

A crash that took the scheduler down usually left epochs half done; waiting for the recovery DAG's
next scheduled run would leave them so for up to a whole schedule interval. Registered through the
provider info's ``plugins`` (loaded when ``[core] lazy_discover_providers`` is off) and, where the
package declares it, the ``airflow.plugins`` entry point.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_exactly_once.plugins.listener import RecoveryOnSchedulerStart

recovery_listener = RecoveryOnSchedulerStart()


class ExactlyOncePlugin(AirflowPlugin):
    name = "exactly_once"
    listeners = [recovery_listener]  # noqa: RUF012 - AirflowPlugin declares it as a class attribute


__all__ = ["ExactlyOncePlugin", "RecoveryOnSchedulerStart", "recovery_listener"]
