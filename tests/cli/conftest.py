"""The ``eo-sink`` suite runs on the operations suite's set-up (its conftest configures Airflow first)."""

from __future__ import annotations

from tests.operations.conftest import world

__all__ = ["world"]
