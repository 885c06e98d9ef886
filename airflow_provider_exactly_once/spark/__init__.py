"""The PySpark application that writes one epoch (design.md section 8, ``spark/``).

Nothing here is imported by ``core/``. ``author_specs`` (the inputs and targets a DAG author writes)
and ``jobspec`` import neither Spark nor pyiceberg, so a DAG file names them and the operator builds
and validates a job spec on an Airflow worker that never starts a JVM; the other modules run inside
``spark-submit`` (driver and executors), or in a Spark Connect client (``connect_write``).
``epoch_writer`` is the application: it resolves its targets, reads the input (``inputs``), fits it
to each target (``alignment``), writes the data files (``writers``) or an upsert's rewrite
(``upsert``), and reaches object stores and executors through ``file_io``.
"""
