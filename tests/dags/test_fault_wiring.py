"""``coordinator_for`` arms the fault hook that ``[exactly_once] fault_hook`` names in the coordinator
and the committer it builds, so an operator task dies at the named point (here the fault harness's
reader with ``EXACTLY_ONCE_FAULT``); the next attempt, without the fault, finishes the epoch once.
With the option unset a task reads and imports nothing about faults. Real meta store (SQLite) and a
real file sink."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus, EpochStatus
from airflow_provider_exactly_once.core.faults import SimulatedCrash
from airflow_provider_exactly_once.runtime.assembly import FAULT_HOOK_ENV_VAR, coordinator_for
from airflow_provider_exactly_once.sinks.config import FileSinkConfig
from demo.fault_plan import FAULT_ENV_VAR, FAULT_HOOK_FACTORY, FAULT_PLAN_ENV_VAR
from tests.support.pipeline import Pipeline

EPOCH = 1714521600000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def harness_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The option as the demo and the harness set it (the test without it removes it again)."""
    monkeypatch.setenv(FAULT_HOOK_ENV_VAR, FAULT_HOOK_FACTORY)


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    (tmp_path / "warehouse").mkdir()
    return Pipeline(
        meta_url=f"sqlite:///{tmp_path / 'meta.db'}",
        catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}",
        warehouse=tmp_path / "warehouse",
        catalog_name="c",
        namespace="ns",
    )


def final_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.parquet") if "_staging" not in p.parts)


def test_crash_between_the_visible_commit_and_the_mark(
    pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sink"
    sink = FileSinkConfig(f"s-{uuid.uuid4().hex[:6]}", str(root))
    pre = pipeline.write_files(sink.sink_id, EPOCH, root, rows=7)
    pipeline.checkpoint(sink.sink_id, EPOCH, CheckpointStatus.COMPLETED)

    monkeypatch.setenv(FAULT_ENV_VAR, "commit.visible:crash")
    crashing = coordinator_for(sink, MetaStoreCheckpoint(), store=pipeline.store)
    crashing.persist(pre)
    with pytest.raises(SimulatedCrash, match=r"commit\.visible"):
        crashing.commit(sink.sink_id, EPOCH)
    row = pipeline.store.get(sink.sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.PENDING and row.commit_decided_at is not None
    visible = final_files(root)
    assert len(visible) == 2  # the files are in place: the crash came after the sink commit

    monkeypatch.delenv(FAULT_ENV_VAR)
    coordinator_for(sink, MetaStoreCheckpoint(), store=pipeline.store).commit(sink.sink_id, EPOCH)
    row = pipeline.store.get(sink.sink_id, EPOCH)
    assert row is not None and row.status is EpochStatus.COMMITTED
    assert final_files(root) == visible  # finished, not moved or written twice


def test_the_committer_gets_the_same_hook(pipeline: Pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``files.before_move`` is the file committer's own point: reaching it proves the hook was passed."""
    root = tmp_path / "sink"
    sink = FileSinkConfig(f"s-{uuid.uuid4().hex[:6]}", str(root))
    pre = pipeline.write_files(sink.sink_id, EPOCH, root, rows=3)
    pipeline.checkpoint(sink.sink_id, EPOCH, CheckpointStatus.COMPLETED)
    monkeypatch.setenv(FAULT_ENV_VAR, "files.before_move@2")
    coordinator = coordinator_for(sink, MetaStoreCheckpoint(), store=pipeline.store)
    coordinator.persist(pre)
    with pytest.raises(SimulatedCrash, match=r"files.before_move \(#2\)"):
        coordinator.commit(sink.sink_id, EPOCH)
    assert len(final_files(root)) == 1  # the first move happened, the second did not


def test_a_malformed_fault_fails_the_task_loudly(pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV_VAR, "commit.visible:sometimes")
    with pytest.raises(ValueError, match=FAULT_ENV_VAR):
        coordinator_for(FileSinkConfig("s", "/tmp/x"), MetaStoreCheckpoint(), store=pipeline.store)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("demo.fault_plan", "is not 'module:callable'"),
        ("no_such_module_here:hook", "cannot import 'no_such_module_here'"),
        ("demo.fault_plan:no_such_factory", "has no callable 'no_such_factory'"),
        ("demo.fault_plan:FAULT_ENV_VAR", "has no callable 'FAULT_ENV_VAR'"),
    ],
)
def test_a_fault_hook_option_that_names_no_factory_fails_naming_the_option(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv(FAULT_HOOK_ENV_VAR, value)
    with pytest.raises(ValueError, match=message) as raised:
        coordinator_for(FileSinkConfig("s", "/tmp/x"), MetaStoreCheckpoint(), store=pipeline.store)
    assert f"[exactly_once] fault_hook ({FAULT_HOOK_ENV_VAR})" in str(raised.value)


#: Persist and commit one epoch as the write and commit tasks do, in a fresh interpreter, then list
#: every module of the package or the harness about faults that the process imported.
UNSET_CHILD = """
import sys
from pathlib import Path

from airflow_provider_exactly_once.checkpoints.config import MetaStoreCheckpoint
from airflow_provider_exactly_once.core.epochs import CheckpointStatus
from airflow_provider_exactly_once.runtime.assembly import coordinator_for
from airflow_provider_exactly_once.sinks.config import FileSinkConfig
from tests.support.pipeline import Pipeline

tmp, epoch = Path(sys.argv[1]), int(sys.argv[2])
(tmp / "warehouse").mkdir()
pipeline = Pipeline(f"sqlite:///{tmp / 'meta.db'}", f"sqlite:///{tmp / 'catalog.db'}", tmp / "warehouse", "c", "ns")
sink = FileSinkConfig("unset-sink", str(tmp / "sink"))
pre = pipeline.write_files(sink.sink_id, epoch, tmp / "sink", rows=3)
pipeline.checkpoint(sink.sink_id, epoch, CheckpointStatus.COMPLETED)
coordinator = coordinator_for(sink, MetaStoreCheckpoint(), store=pipeline.store, epoch=epoch, try_number=1)
coordinator.persist(pre)
coordinator.commit(sink.sink_id, epoch)
print("status:", pipeline.store.get(sink.sink_id, epoch).status.value)
ours = [m for m in sys.modules if m.startswith(("airflow_provider_exactly_once", "fault_harness"))]
print("modules:", sorted(m for m in ours if any(part.startswith("fault") for part in m.split("."))))
"""


def test_with_the_option_unset_a_task_imports_and_reads_nothing_about_faults(tmp_path: Path) -> None:
    """The harness's variables set but the option not: they are not read (the commit passes the point
    they arm), and no fault reader is imported, only the hook's type and its no-op (``core.faults``)."""
    env = {k: v for k, v in os.environ.items() if k != FAULT_HOOK_ENV_VAR}
    env |= {FAULT_ENV_VAR: "commit.visible:crash", FAULT_PLAN_ENV_VAR: str(tmp_path / "absent-plan.json")}
    done = subprocess.run(
        [sys.executable, "-c", UNSET_CHILD, str(tmp_path), str(EPOCH)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    said = [line for line in done.stdout.splitlines() if line.startswith(("status:", "modules:"))]
    assert said == ["status: Committed", "modules: ['airflow_provider_exactly_once.core.faults']"], done.stdout
