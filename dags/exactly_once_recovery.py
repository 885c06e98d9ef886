"""The recovery DAG: copy this file into the DAGs folder (or point a bundle at it).

It finishes every epoch a crash left half done, for every sink in the meta store's registry, and
removes orphaned write locations. It runs every 15 minutes (``[exactly_once] recovery_schedule``)
and, with the provider's plugin loaded, as soon as the scheduler starts.
"""

from __future__ import annotations

from airflow_provider_exactly_once.recovery.dag import recovery_dag

dag = recovery_dag()
