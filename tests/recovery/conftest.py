"""The recovery suite runs on the Airflow suite's set-up: importing its conftest points Airflow at a
private AIRFLOW_HOME before anything imports Airflow, and brings its fixtures (``airflow_home``,
``world``, ``unique``)."""

from __future__ import annotations

from tests.airflow.conftest import airflow_home, unique, world

__all__ = ["airflow_home", "unique", "world"]
