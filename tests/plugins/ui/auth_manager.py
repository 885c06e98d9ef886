"""An auth manager that grants some users some DAGs only, as FAB or Keycloak deployments do.

Airflow's SimpleAuthManager decides by role alone, so no user of it may read one DAG and not
another. This subclass keeps its users, login and tokens, and for each user named in
``EO_TEST_DAGS_BY_USER`` (JSON ``{"user": ["dag_id", ...]}``) allows reading and editing only those
DAGs: access to DAGs *in general* (no DAG id) is refused to them, as FAB refuses it to a user
without the all-DAGs permission. The API server imports it by name from ``[core] auth_manager``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

ENV = "EO_TEST_DAGS_BY_USER"


class PerDagAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        allowed = self._dags_of(user)
        if allowed is not None and (details is None or details.id not in allowed):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)

    @staticmethod
    def _dags_of(user: Any) -> set[str] | None:
        restricted: dict[str, list[str]] = json.loads(os.environ.get(ENV) or "{}")
        dags = restricted.get(user.get_name())
        return None if dags is None else set(dags)
