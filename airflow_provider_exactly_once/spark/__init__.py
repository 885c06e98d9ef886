"""The PySpark application that writes one epoch (design.md section 8, ``spark/``).

Nothing here is imported by ``core/``. ``jobspec`` imports neither Spark nor pyiceberg, so the
operator can build and validate a job spec on an Airflow worker that never starts a JVM; the other
modules run inside ``spark-submit`` (driver and executors).
"""
