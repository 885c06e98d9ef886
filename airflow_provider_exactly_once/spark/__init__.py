"""The PySpark application that writes one epoch (design.md, "Layers", ``spark/``).

``author_specs`` and ``jobspec`` import neither Spark nor pyiceberg, so a DAG names them and the
operator validates a job spec without a JVM; the rest runs in ``spark-submit`` or a Spark Connect
client (``connect_write``). ``epoch_writer`` is the application: it reads the input (``inputs``),
fits it to each target (``alignment``), writes the files (``writers``) or an upsert's rewrite
(``upsert``), and reaches object stores and executors through ``file_io``.
"""
