"""Whether this worker can run the write's ``spark-submit``, checked before anything is submitted.

The base install carries no PySpark (a scheduler image need not hold Spark's jars): the write task
needs only the ``spark-submit`` its Spark connection names, from the ``[spark]`` extra or from a
Spark distribution on the worker's ``PATH``. Without either, the provider's hook would fail inside
``subprocess`` with a bare ``FileNotFoundError``; this says what to install instead.
"""

from __future__ import annotations

import re
import shutil
from importlib import metadata, util
from pathlib import Path

from airflow_provider_exactly_once.core.errors import InvalidSinkConfig
from airflow_provider_exactly_once.extras import DISTRIBUTION

__all__ = ["check_pyspark_files", "check_spark_submit"]

_VERSION_LINE = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*["']([^"']+)["']""", re.MULTILINE)


def check_spark_submit(task_id: str, binary: str, conn_id: str) -> str:
    """The path of ``binary`` on ``PATH``, or an error naming both remedies."""
    found = shutil.which(binary)
    if found is None:
        raise InvalidSinkConfig(
            f"task {task_id}: no {binary!r} on this worker's PATH (asked for by the Spark connection {conn_id!r}): "
            f"install the [spark] extra, whose PySpark ships spark-submit (pip install '{DISTRIBUTION}[spark]'), "
            f"or put a Spark distribution's bin/ directory on the worker's PATH"
        )
    check_pyspark_files()
    return found


def check_pyspark_files() -> None:
    """Refuse a PySpark whose Python files are another release's.

    The Spark provider depends on ``pyspark-client``, which unpacks into the same ``pyspark/``
    directory as PySpark itself; when the two releases differ and the client was unpacked last,
    every Python function Spark runs (the writer's are) fails deep inside an executor.
    """
    spec = util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return  # no local PySpark: spark-submit comes from a Spark distribution, which is whole
    version_file = Path(spec.origin).with_name("version.py")
    try:
        installed = metadata.version("pyspark")
        match = _VERSION_LINE.search(version_file.read_text(encoding="utf-8"))
    except (metadata.PackageNotFoundError, OSError):
        return
    if match is not None and match.group(1) != installed:
        raise InvalidSinkConfig(
            f"the installed pyspark {installed} holds the Python files of release {match.group(1)} "
            f"(pyspark-client, a dependency of the Spark provider, unpacked over it): reinstall it with "
            f"pip install --force-reinstall --no-deps 'pyspark=={installed}', or keep pyspark-client out "
            f"(uv: override-dependencies = [\"pyspark-client; sys_platform == 'never'\"])"
        )
