"""The plugin's listener: a starting scheduler queues one recovery run; nothing else does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_provider_exactly_once.plugins import ExactlyOncePlugin, recovery_listener
from airflow_provider_exactly_once.recovery.dag import recovery_dag
from tests.support.airflow_world import register


def _runs(dag_id: str) -> list[tuple[str, str, str]]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id)).all()
        return [(r.run_id, str(r.state), str(r.run_type)) for r in runs]


@pytest.fixture
def recovery_dag_id(airflow_home: Path, unique: str, monkeypatch: pytest.MonkeyPatch) -> str:
    dag_id = f"eo_recovery_{unique}"
    register(recovery_dag(dag_id, schedule=None))
    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__RECOVERY_DAG_ID", dag_id)
    return dag_id


def test_the_plugin_declares_the_listener() -> None:
    from airflow.plugins_manager import is_valid_plugin

    from airflow_provider_exactly_once.get_provider_info import get_provider_info

    assert is_valid_plugin(ExactlyOncePlugin)
    assert ExactlyOncePlugin.listeners == [recovery_listener]
    plugin_classes = [p["plugin-class"] for p in get_provider_info()["plugins"]]
    assert plugin_classes == ["airflow_provider_exactly_once.plugins.ExactlyOncePlugin"]


def test_a_starting_scheduler_queues_one_recovery_run(recovery_dag_id: str) -> None:
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    runner = SchedulerJobRunner(job=Job())
    recovery_listener.on_starting(component=runner.job)
    runs = _runs(recovery_dag_id)
    assert len(runs) == 1 and runs[0][1] == "queued" and runs[0][0].startswith("scheduler_start__"), runs

    recovery_listener.on_starting(component=runner.job)  # a second start while one is queued
    recovery_listener.on_starting(component=runner)
    assert _runs(recovery_dag_id) == runs


def test_other_components_queue_nothing(recovery_dag_id: str) -> None:
    from airflow.jobs.job import Job
    from airflow.jobs.triggerer_job_runner import TriggererJobRunner
    from airflow.sdk.execution_time.task_runner import TaskRunnerMarker

    recovery_listener.on_starting(component=Job())  # untyped, and not built by the scheduler
    recovery_listener.on_starting(component=TriggererJobRunner(job=Job()).job)
    recovery_listener.on_starting(component=TaskRunnerMarker())
    recovery_listener.on_starting(component=object())
    assert _runs(recovery_dag_id) == []


def test_a_missing_dag_never_breaks_the_scheduler(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    monkeypatch.setenv("AIRFLOW__EXACTLY_ONCE__RECOVERY_DAG_ID", "no_such_dag_anywhere")
    recovery_listener.on_starting(component=SchedulerJobRunner(job=Job()).job)  # logs, does not raise
    assert _runs("no_such_dag_anywhere") == []


def test_the_real_scheduler_queues_a_recovery_run(recovery_dag_id: str, airflow_home: Path, tmp_path: Path) -> None:
    """``airflow scheduler`` in a subprocess on this AIRFLOW_HOME, the plugin loaded from the provider
    info (``lazy_discover_providers`` off): its start queues the recovery run."""
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False",
        "AIRFLOW__EXACTLY_ONCE__RECOVERY_DAG_ID": recovery_dag_id,
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "1",
    }
    airflow = Path(sys.executable).with_name("airflow")
    log = tmp_path / "scheduler.log"
    with log.open("w") as out:
        scheduler = subprocess.Popen(
            [str(airflow), "scheduler", "--skip-serve-logs", "--num-runs", "5"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 60
            runs: list[tuple[str, str, str]] = []
            while time.monotonic() < deadline and not runs and scheduler.poll() is None:
                time.sleep(1)
                runs = [r for r in _runs(recovery_dag_id) if r[0].startswith("scheduler_start__")]
            runs = runs or [r for r in _runs(recovery_dag_id) if r[0].startswith("scheduler_start__")]
        finally:
            if scheduler.poll() is None:
                scheduler.terminate()
                try:
                    scheduler.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    scheduler.kill()
                    scheduler.wait(timeout=10)
    assert len(runs) == 1, f"no recovery run after the scheduler started; its log:\n{log.read_text()[-4000:]}"


def test_every_airflow_cfg_option_is_documented_with_its_default() -> None:
    from airflow_provider_exactly_once.get_provider_info import get_provider_info

    options = get_provider_info()["config"]["exactly_once"]["options"]
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    for name, option in options.items():
        assert f"| `{name}` | `{option['default']}` |" in page, f"docs/configuration.md lacks [exactly_once] {name}"
