"""The exactly-once core: models, ports and the two-phase-commit coordinator.

Nothing here imports Airflow or Spark, so the whole protocol can be tested, reasoned about and
reused without either.
"""
