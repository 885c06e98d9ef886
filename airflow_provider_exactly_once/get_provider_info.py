"""Airflow's provider registry reads this through the ``apache_airflow_provider`` entry point.

It imports nothing: the registry calls it in every Airflow process, and Airflow 3.2+ builds the
connection form from the declarative ``ui-field-behaviour`` here without importing the hook.
"""

from __future__ import annotations

from typing import Any

from airflow_provider_exactly_once.version import __version__

#: The meta-store connection form: one SQLAlchemy URL field (``host``), an optional password kept
#: masked, extra for timeouts. Python-style keys, as ``BaseHook.get_ui_field_behaviour`` returns them.
META_STORE_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden_fields": ["schema", "port", "login"],
    "relabeling": {"host": "SQLAlchemy URL", "password": "Password (if not in the URL)"},
    "placeholders": {
        "host": "postgresql+psycopg2://user@db-host:5432/exactly_once  or  sqlite:////var/lib/airflow/meta.db",
        "password": "kept masked; put into the URL when the URL has none",
        "extra": '{"connect_timeout_s": 10, "busy_timeout_s": 30}',
    },
}

_INTEGRATION = "Exactly-once sinks"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-exactly-once",
        "name": "Exactly-once sinks",
        "description": "Exactly-once delivery from PySpark into Apache Iceberg tables and file sinks.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": _INTEGRATION,
                "external-doc-url": "https://iceberg.apache.org/",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_exactly_once.hooks.meta_store"]}
        ],
        "operators": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": [
                    "airflow_provider_exactly_once.operators.epoch",
                    "airflow_provider_exactly_once.operators.checkpoint",
                    "airflow_provider_exactly_once.operators.spark_precommit",
                    "airflow_provider_exactly_once.operators.rewrite",
                ],
            }
        ],
        "sensors": [
            {"integration-name": _INTEGRATION, "python-modules": ["airflow_provider_exactly_once.sensors.checkpoint"]}
        ],
        "triggers": [
            {
                "integration-name": _INTEGRATION,
                "python-modules": ["airflow_provider_exactly_once.triggers.checkpoint"],
            }
        ],
        "plugins": [
            {"name": "exactly_once", "plugin-class": "airflow_provider_exactly_once.plugins.ExactlyOncePlugin"}
        ],
        # The commit task's link to its epoch's page, and the asset scheme its events use
        # (``observability``): ``iceberg://<catalog>/<namespace>/<table>``.
        "extra-links": ["airflow_provider_exactly_once.observability.links.EpochLink"],
        "asset-uris": [
            {
                "schemes": ["iceberg"],
                "handler": "airflow_provider_exactly_once.observability.assets.sanitize_uri",
                "factory": "airflow_provider_exactly_once.observability.assets.create_asset",
            }
        ],
        "config": {
            "exactly_once": {
                "description": "The exactly-once provider's recovery DAG and its scheduler-start trigger.",
                "options": {
                    "recovery_schedule": {
                        "description": "Schedule of the recovery DAG (cron or preset); 'none' leaves only the "
                        "run queued when the scheduler starts.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "*/5 * * * *",
                        "default": "*/15 * * * *",
                    },
                    "recovery_orphan_grace_seconds": {
                        "description": "How old every file of a write location no epoch or clean-up names must "
                        "be before recovery removes it; longer than any write runs before it is persisted.",
                        "version_added": "0.1.0",
                        "type": "float",
                        "example": "86400",
                        "default": "21600",
                    },
                    "history_retention_days": {
                        "description": "How many days the recovery DAG keeps each sink's epoch history "
                        "(every persist, commit, abort, revision and clean-up); older history rows are deleted, "
                        "the epochs themselves never.",
                        "version_added": "0.2.0",
                        "type": "float",
                        "example": "365",
                        "default": "90",
                    },
                    "spark_connect_retry_seconds": {
                        "description": "How long a write through Spark Connect retries a server that does not "
                        "answer, per call, before the task fails (to be retried as a task); PySpark's own retries "
                        "would wait ten minutes and more.",
                        "version_added": "0.3.0",
                        "type": "float",
                        "example": "300",
                        "default": "60",
                    },
                    "full_file_check_after_seconds": {
                        "description": "How long after its persist an epoch's commit checks only the manifests "
                        "its write's persist wrote before deciding, not every data file; an older epoch's commit, "
                        "and every recovery, lists every file. Keep it well below the age that orphan-file removal "
                        "spares (remove_orphan_files: 3 days by default) less the longest write; 0 lists every file "
                        "for every commit.",
                        "version_added": "0.3.0",
                        "type": "float",
                        "example": "3600",
                        "default": "86400",
                    },
                    "recovery_dag_id": {
                        "description": "The recovery DAG the scheduler-start listener triggers.",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "exactly_once_recovery",
                        "default": "exactly_once_recovery",
                    },
                    "meta_conn_id": {
                        "description": "The meta store connection the sink-state view in the Airflow UI reads and "
                        "acts on (the API server's side; tasks name theirs per operator).",
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": "exactly_once_prod",
                        "default": "exactly_once_default",
                    },
                    "sink_listing": {
                        "description": "Which sinks the sink-state view lists to a user: 'per_dag' (those with an "
                        "epoch of a DAG the user may read, with counts of those epochs only) or 'all' (every sink "
                        "and all its counts to any user who may read some DAG; epochs stay filtered per DAG).",
                        "version_added": "0.2.0",
                        "type": "string",
                        "example": "all",
                        "default": "per_dag",
                    },
                    "stale_run_minutes": {
                        "description": "How long an unsettled epoch's DAG run may be 'running' in Airflow with no "
                        "live task (none queued, deferred, up for retry, or running with a heartbeat) before "
                        "eo-sink status and the sink-state view say it will never finish and how to fail it.",
                        "version_added": "0.3.0",
                        "type": "float",
                        "example": "180",
                        "default": "60",
                    },
                    "fault_hook": {
                        "description": "Fault injection, for tests only: 'module:callable' naming a factory "
                        "(sink_id, epoch, try_number) -> fault hook that every coordinator a task builds calls "
                        "at its named fault points. Unset in production: the tasks then import and read nothing "
                        "about faults.",
                        "version_added": "0.3.0",
                        "type": "string",
                        "example": "demo.fault_plan:fault_hook_for",
                        "default": "",
                    },
                    "trigger_recovery_on_scheduler_start": {
                        "description": "Queue a recovery run when a scheduler starts (unless one is queued or running).",
                        "version_added": "0.1.0",
                        "type": "boolean",
                        "example": "False",
                        "default": "True",
                    },
                },
            }
        },
        "connection-types": [
            {
                "hook-class-name": "airflow_provider_exactly_once.hooks.meta_store.ExactlyOnceMetaStoreHook",
                "hook-name": "Exactly-once meta store",
                "connection-type": "exactly_once_meta",
                "ui-field-behaviour": {
                    "hidden-fields": META_STORE_FIELD_BEHAVIOUR["hidden_fields"],
                    "relabeling": META_STORE_FIELD_BEHAVIOUR["relabeling"],
                    "placeholders": META_STORE_FIELD_BEHAVIOUR["placeholders"],
                },
            }
        ],
    }
