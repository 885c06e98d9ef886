"""What a failed harness test prints: the failing scenarios first, then the others' runs and actions.

CI keeps only the head of a long failure; a report listing every scenario in name order once hid the
one that failed behind a dozen that did not.
"""

from __future__ import annotations

import json
from typing import Any


def failures(report: dict[str, Any]) -> str:
    def summary(result: dict[str, Any]) -> dict[str, Any]:
        return {k: result[k] for k in ("anomalies", "action_error", "runs", "actions")}

    scenarios: dict[str, dict[str, Any]] = report["scenarios"]
    failing = {n: r for n, r in scenarios.items() if r["anomalies"] or r["action_error"]}
    passing = {n: r for n, r in scenarios.items() if n not in failing}
    return json.dumps(
        {
            "recovery_run": report.get("recovery_run"),
            "failing": {n: summary(r) for n, r in failing.items()},
            "passing": {n: summary(r) for n, r in passing.items()},
        },
        indent=1,
        default=str,
    )
