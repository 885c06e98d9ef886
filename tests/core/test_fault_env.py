"""``fault_hook_from_env``: the demo and the fault-injection harness stop a real task at a named point."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from airflow_provider_exactly_once.core.faults import (
    FAULT_ENV_VAR,
    EnvFaultHook,
    FaultSpec,
    SimulatedCrash,
    fault_hook_from_env,
    no_faults,
)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_or_empty_means_no_faults(value: str | None) -> None:
    environ = {} if value is None else {FAULT_ENV_VAR: value}
    assert fault_hook_from_env(environ) is no_faults


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("commit.visible", FaultSpec("commit.visible", 1, "crash")),
        ("commit.visible:crash", FaultSpec("commit.visible", 1, "crash")),
        ("commit.decided@3", FaultSpec("commit.decided", 3, "crash")),
        ("iceberg.after_catalog_update@2:kill", FaultSpec("iceberg.after_catalog_update", 2, "kill")),
    ],
)
def test_specs_are_read(text: str, spec: FaultSpec) -> None:
    hook = fault_hook_from_env({FAULT_ENV_VAR: text})
    assert isinstance(hook, EnvFaultHook) and hook.spec == spec


@pytest.mark.parametrize("text", ["commit", "commit.visible@0", "commit.visible:explode", "Commit.Visible", "@2"])
def test_malformed_specs_are_refused_not_ignored(text: str) -> None:
    with pytest.raises(ValueError, match=FAULT_ENV_VAR):
        fault_hook_from_env({FAULT_ENV_VAR: text})


def test_crash_at_the_nth_occurrence_only() -> None:
    hook = fault_hook_from_env({FAULT_ENV_VAR: "commit.visible@2"})
    hook("commit.decided")
    hook("commit.visible")  # the first time passes
    with pytest.raises(SimulatedCrash, match=r"commit.visible \(#2\)"):
        hook("commit.visible")
    hook("commit.visible")  # armed once: the third time passes again


def test_kill_sends_sigkill_to_the_process() -> None:
    """The process dies at the point: nothing after it runs, not even ``finally`` blocks."""
    code = (
        "from airflow_provider_exactly_once.core.faults import fault_hook_from_env\n"
        "hook = fault_hook_from_env()\n"
        "try:\n"
        "    hook('commit.decided'); print('before', flush=True); hook('commit.visible')\n"
        "finally:\n"
        "    print('finally ran', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={FAULT_ENV_VAR: "commit.visible:kill", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "before\n"
