"""Airflow's provider registry reads this through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from typing import Any


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-exactly-once",
        "name": "Exactly-once sinks",
        "description": "Exactly-once delivery from PySpark into Apache Iceberg tables and file sinks.",
        "versions": ["0.1.0"],
    }
