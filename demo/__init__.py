"""The demo: the hourly example DAG through a retry, a failed hour and a crash, on one machine.

``python -m demo`` from the repository's root (what ``scripts/demo`` runs). Everything lives under
one directory (``./.eo-demo`` by default) and uses embedded defaults: SQLite for Airflow, the meta
store and the Iceberg SQL catalog, a local warehouse and ``local[2]`` Spark. With ``--stack s3`` the
tables, the landed input and the checkpoint markers are on a SeaweedFS started under that directory
(its Iceberg REST catalog and S3; ``stacks``), so the same scenarios run on object storage.
``world`` holds the pieces the demo and the example-DAG tests share; ``servers`` the local object
stores the demo, the tests and the fault harness start.

Beside the package, not in it: the wheel ships the provider, and the test servers and the demo's
world are for this repository's demo, tests, benchmarks and fault harness only.
"""
