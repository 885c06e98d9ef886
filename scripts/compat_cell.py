"""Checks run inside one compatibility cell's environment (``scripts/compat``), from outside the
source tree, so they see the installed distribution: its provider registration and every module's
import. Prints one JSON object; exits non-zero when a check failed.

Without an extra, a module that needs it must fail with ``MissingExtra`` naming that extra (and the
PySpark application's modules, which only ever run inside spark-submit, with pyspark missing);
every other module must import.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import pkgutil
import sys
import traceback

PACKAGE = "airflow_provider_exactly_once"
DISTRIBUTION = "airflow-provider-exactly-once"
#: The PySpark application: run by spark-submit, where pyspark is there by construction.
SPARK_APPLICATION = f"{PACKAGE}.spark."
#: What the operator imports on an Airflow worker, where pyspark need not be.
SPARK_LIGHT = {f"{PACKAGE}.spark.jobspec", f"{PACKAGE}.spark.author_specs"}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def registration() -> dict[str, object]:
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    info = manager.providers.get(DISTRIBUTION)
    if info is None:
        raise AssertionError(f"{DISTRIBUTION} is not in Airflow's providers list: {sorted(manager.providers)[:5]}...")
    version = md.version(DISTRIBUTION)
    if info.version != version:
        raise AssertionError(f"get_provider_info says {info.version}, the installed wheel {version}")
    hooks = manager.hooks
    if "exactly_once_meta" not in hooks:
        raise AssertionError(f"connection type exactly_once_meta not registered: {sorted(hooks)[:10]}")
    return {"version": version, "connection_types": ["exactly_once_meta"]}


def imports() -> dict[str, object]:
    from airflow_provider_exactly_once.extras import MissingExtra

    package = importlib.import_module(PACKAGE)
    # A ``__main__`` is a program (the demo, the CLI), not a module to import.
    modules = pkgutil.walk_packages(package.__path__, f"{PACKAGE}.")
    names = sorted(m.name for m in modules if not m.name.endswith(".__main__"))
    failed: dict[str, str] = {}
    needs_extra: dict[str, str] = {}
    for name in names:
        try:
            importlib.import_module(name)
        except MissingExtra as exc:
            needs_extra[name] = exc.extra
        except ModuleNotFoundError as exc:
            if (
                name.startswith(SPARK_APPLICATION)
                and name not in SPARK_LIGHT
                and exc.name == "pyspark"
                and not installed("pyspark")
            ):
                needs_extra[name] = "spark"
            else:
                failed[name] = traceback.format_exc(limit=3)
        except Exception:
            failed[name] = traceback.format_exc(limit=3)
    if failed:
        raise AssertionError("modules that do not import:\n" + "\n".join(f"{k}: {v}" for k, v in failed.items()))
    return {"modules": len(names), "need_an_extra": needs_extra, "location": package.__file__}


def main() -> int:
    result: dict[str, object] = {"python": sys.version.split()[0], "airflow": md.version("apache-airflow")}
    ok = True
    for check in (registration, imports):
        try:
            result[check.__name__] = check()
        except Exception as exc:
            ok = False
            result[check.__name__] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
