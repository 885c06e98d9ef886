"""The fault reader (``demo.fault_plan``): the demo and the fault-injection harness
stop a real task at a named point, once ``[exactly_once] fault_hook`` names ``fault_hook_for``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_exactly_once.core.faults import SimulatedCrash, no_faults
from demo.fault_plan import (
    FAULT_ENV_VAR,
    FAULT_PLAN_ENV_VAR,
    EnvFaultHook,
    FaultSpec,
    PlanFaultHook,
    fault_hook_for,
    fault_hook_from_env,
    load_fault_plan,
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
        "from demo.fault_plan import fault_hook_from_env\n"
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


# -- per-epoch fault plans (EXACTLY_ONCE_FAULT_PLAN), for the fault-injection harness -------------


def _plan(tmp_path: Path, rules: object) -> dict[str, str]:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(rules), encoding="utf-8")
    return {FAULT_PLAN_ENV_VAR: str(path)}


def test_without_a_plan_the_per_epoch_hook_is_the_env_hook() -> None:
    assert fault_hook_for("s", 1, 1, {}) is no_faults
    hook = fault_hook_for("s", 1, 1, {FAULT_ENV_VAR: "commit.visible"})
    assert isinstance(hook, EnvFaultHook) and hook.spec == FaultSpec("commit.visible")


def test_a_plan_arms_only_its_sink_epoch_and_try(tmp_path: Path) -> None:
    env = _plan(tmp_path, [{"sink": "s", "epoch": 7, "point": "commit.visible", "try": 1}])
    assert fault_hook_for("s", 8, 1, env) is no_faults  # another epoch
    assert fault_hook_for("t", 7, 1, env) is no_faults  # another sink
    assert fault_hook_for("s", 7, 2, env) is no_faults  # the retry runs clean
    hook = fault_hook_for("s", 7, 1, env)
    hook("commit.decided")
    with pytest.raises(SimulatedCrash, match=r"commit\.visible"):
        hook("commit.visible")


def test_a_plan_rule_without_try_applies_to_every_try_and_keeps_the_env_fault(tmp_path: Path) -> None:
    env = {
        **_plan(tmp_path, [{"sink": "s", "epoch": 7, "point": "persist.inserted", "occurrence": 2}]),
        FAULT_ENV_VAR: "commit.marked",
    }
    for attempt in (1, 5):
        hook = fault_hook_for("s", 7, attempt, env)
        assert isinstance(hook, PlanFaultHook)
        hook("persist.inserted")  # the first time passes
        with pytest.raises(SimulatedCrash, match=r"persist\.inserted"):
            hook("persist.inserted")
        with pytest.raises(SimulatedCrash, match=FAULT_ENV_VAR):  # the env var still applies
            hook("commit.marked")


def test_a_pause_rule_sleeps_and_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("time.sleep", slept.append)  # the sleep itself is not what is tested
    env = _plan(tmp_path, [{"sink": "s", "epoch": 7, "point": "iceberg.loaded", "mode": "pause", "seconds": 2.5}])
    hook = fault_hook_for("s", 7, None, env)
    hook("iceberg.loaded")
    hook("iceberg.loaded")
    assert slept == [2.5]


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"sink": "s"}, "JSON list"),
        ([["s", 7]], "JSON object"),
        ([{"sink": "s", "epoch": 7}], "missing keys \\['point'\\]"),
        ([{"sink": "s", "epoch": 7, "point": "commit.visible", "when": 1}], "unknown keys \\['when'\\]"),
        ([{"sink": "s", "epoch": -1, "point": "commit.visible"}], "'epoch'"),
        ([{"sink": "s", "epoch": 7, "point": "Commit"}], "'point'"),
        ([{"sink": "s", "epoch": 7, "point": "commit.visible", "occurrence": 0}], "'occurrence'"),
        ([{"sink": "s", "epoch": 7, "point": "commit.visible", "try": 0}], "'try'"),
        ([{"sink": "s", "epoch": 7, "point": "commit.visible", "mode": "explode"}], "'mode'"),
        ([{"sink": "s", "epoch": 7, "point": "commit.visible", "mode": "pause"}], "'seconds'"),
    ],
)
def test_malformed_plans_are_refused_with_the_rule_named(tmp_path: Path, rules: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        fault_hook_for("s", 7, 1, _plan(tmp_path, rules))
    assert FAULT_PLAN_ENV_VAR in str(raised.value)


def test_a_missing_plan_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the fault plan"):
        fault_hook_for("s", 7, 1, {FAULT_PLAN_ENV_VAR: str(tmp_path / "absent.json")})
    assert load_fault_plan(_plan(tmp_path, [])[FAULT_PLAN_ENV_VAR]) == []


def test_a_planned_kill_sends_sigkill(tmp_path: Path) -> None:
    env = _plan(tmp_path, [{"sink": "s", "epoch": 7, "point": "commit.visible", "mode": "kill"}])
    code = (
        "from demo.fault_plan import fault_hook_for\n"
        "hook = fault_hook_for('s', 7, 1)\n"
        "hook('commit.decided'); print('before', flush=True); hook('commit.visible'); print('after')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env={**env, "PATH": ""}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout == "before\n"
