"""Bytecode for the environment and the source tree, as an installed deployment has it.

Every Airflow task start is a fresh interpreter that imports Airflow, the SDK, the providers and
the task's modules. An installed deployment imports them from ``.pyc`` files (pip and most images
compile at install); an environment created with ``PYTHONDONTWRITEBYTECODE`` set, as this sandbox
sets it, has none and never writes them, so every start compiles everything from source, several
times slower. Benchmarks of task starts compile first, so they measure what users run.
"""

from __future__ import annotations

import compileall
import sysconfig
from pathlib import Path


def compile_bytecode(*trees: Path) -> None:
    """Compile the running environment's site-packages and ``trees`` (fast when already compiled)."""
    for root in (Path(sysconfig.get_paths()["purelib"]), *trees):
        compileall.compile_dir(root, quiet=2, workers=0)
