"""Airflow's version differences, in one place, as the official providers keep them.

Every module that talks to Airflow takes the names that moved between minors from here, so the day a
minor leaves the supported range (docs/compatibility.md) only this file shrinks; importing it under
an Airflow outside the range fails at once, naming the range. Airflow's private parts sit beside it,
in ``upstream_private``.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import TYPE_CHECKING, Any

from airflow import __version__ as _airflow_version
from packaging.version import Version

from airflow_provider_exactly_once.version import __version__ as PROVIDER_VERSION

__all__ = [
    "AIRFLOW_VERSION",
    "AIRFLOW_V_3_2_PLUS",
    "AIRFLOW_V_3_3_PLUS",
    "HTTP_422",
    "MAX_AIRFLOW_EXCLUSIVE",
    "MIN_AIRFLOW",
    "AirflowException",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "check_airflow_version",
    "conf",
    "normalize_stat_name",
    "spark_submit_has_durable",
    "stats",
]

MIN_AIRFLOW = Version("3.1.1")
MAX_AIRFLOW_EXCLUSIVE = Version("3.4")


def check_airflow_version(version: str) -> Version:
    """The release of ``version`` (pre-releases and local tags count as their release), or an
    ``ImportError`` naming the supported range."""
    release = Version(Version(version).base_version)
    if not MIN_AIRFLOW <= release < MAX_AIRFLOW_EXCLUSIVE:
        raise ImportError(
            f"airflow-provider-exactly-once {PROVIDER_VERSION} supports Apache Airflow >={MIN_AIRFLOW},"
            f"<{MAX_AIRFLOW_EXCLUSIVE}, not {version}: install a supported Airflow "
            f"(pip install 'apache-airflow>={MIN_AIRFLOW},<{MAX_AIRFLOW_EXCLUSIVE}') or the provider release made for yours"
        )
    return release


AIRFLOW_VERSION = check_airflow_version(_airflow_version)
AIRFLOW_V_3_2_PLUS = Version("3.2.0") <= AIRFLOW_VERSION
AIRFLOW_V_3_3_PLUS = Version("3.3.0") <= AIRFLOW_VERSION

# The Task SDK took over configuration and the task-facing exceptions in 3.2; before, tasks used
# Airflow core's, and the SDK's own ``BaseHook.get_connection`` raised core's AirflowNotFoundException.
if TYPE_CHECKING or AIRFLOW_V_3_2_PLUS:
    from airflow.sdk.configuration import conf
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )
else:
    from airflow.configuration import conf
    from airflow.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )

#: Module-level ``incr``/``gauge``/``timing`` are 3.3's; before, the same calls are ``Stats``'s.
stats: Any
if TYPE_CHECKING or AIRFLOW_V_3_3_PLUS:
    from airflow.sdk.observability import stats
else:
    from airflow.stats import Stats as stats

#: What StatsD accepts in a name (Airflow 3.3's ``normalize_name_for_stats`` allows the same).
_INVALID_STAT_CHARS = re.compile(r"[^a-zA-Z0-9_.-]")


def normalize_stat_name(name: str) -> str:
    """``name`` with every character a metrics backend refuses replaced by ``_``."""
    return _INVALID_STAT_CHARS.sub("_", name)


#: Starlette renamed 422's constant (``HTTP_422_UNPROCESSABLE_ENTITY`` before 0.48); the number is stable.
HTTP_422 = 422


@functools.cache
def spark_submit_has_durable() -> bool:
    """Whether to pass ``durable`` to ``SparkSubmitOperator``: the Spark provider knows it from 6.3
    and Airflow acts on it from 3.3; below either, passing it is an error or only a warning."""
    if not AIRFLOW_V_3_3_PLUS:
        return False
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    return "durable" in inspect.signature(SparkSubmitOperator.__init__).parameters
