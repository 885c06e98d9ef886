"""``eo-sink`` whose reader leaves early (``eo-sink epochs | head``), as a shell runs it: the installed
script, its stdout a real pipe. It stops at once, says nothing on stderr and exits 141 (128 +
SIGPIPE), the status a shell reports for any tool its reader left; before, it ended on
``BrokenPipeError: [Errno 32] Broken pipe (unexpected; ...)`` or Python's "Exception ignored" (issue 55).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from airflow_provider_exactly_once.cli.main import EXIT_READER_GONE
from airflow_provider_exactly_once.core.precommit import PreCommit, TableWrite
from airflow_provider_exactly_once.store import SqlSinkStateStore
from tests.cli.test_eo_sink import EO_SINK

SINK = "piped"
#: Epochs of the store, each listed on a line of about 330 characters: ``epochs`` prints about
#: 100 kB, more than a pipe holds (64 kB on Linux) and stdout's buffer, so it writes after ``head`` left.
EPOCHS = 300


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('piped') / 'meta.db'}"
    store = SqlSinkStateStore(url)
    try:
        for e in range(1, EPOCHS + 1):
            pre = PreCommit(
                sink_id=SINK,
                epoch=e * 3_600_000,
                write_id=f"00000000-0000-4000-8000-{e:012d}",
                tables=[TableWrite(table="ns.t", location=f"file:///tmp/{SINK}/{e}")],
            )
            store.insert_pending(pre, run_id=f"manual__{e}_" + "r" * 200, try_number=1, dag_id="d")
    finally:
        store.dispose()
    return url


def test_a_reader_that_closes_after_one_line(url: str) -> None:
    """``eo-sink epochs | head -n 1``: the header line reaches the reader, and nothing more is said."""
    head = shutil.which("head")
    assert head is not None
    reader = subprocess.Popen([head, "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert reader.stdin is not None and reader.stdout is not None
    done = subprocess.run(
        [str(EO_SINK), "epochs", SINK, "--limit", str(EPOCHS), "--url", url],
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    reader.stdin.close()
    first = reader.stdout.read()
    assert reader.wait(timeout=60) == 0
    assert first.startswith("sink") and first.count("\n") == 1
    assert done.stderr == ""
    assert done.returncode == EXIT_READER_GONE == 141


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["status", "--json"],
        ["epochs", SINK, "--json"],
        ["show", SINK, "3600000"],
        ["show", SINK, "3600000", "--json"],
        ["history", SINK, "3600000", "--json"],
        ["gc", "--dry-run"],
    ],
    ids=" ".join,
)
def test_every_command_whose_reader_has_gone(url: str, tmp_path: Path, command: list[str]) -> None:
    """Its stdout a pipe nobody reads any more (the reader closed before a line was written): the
    command's one write fails, text or JSON, and the command is as quiet as above."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [str(EO_SINK), *command, "--url", url],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == EXIT_READER_GONE
