"""What the provider tells the rest of a deployment (docs/observability.md): ``assets`` (Asset events
for committed tables, and metrics through Airflow's ``Stats``), ``lineage`` (OpenLineage datasets),
``links`` and ``urls`` (the operators' links to the epoch view), ``run_origin`` (why a run committed).

Each submodule imports what it needs lazily where the import is costly (OpenLineage), so importing
an operator does not pull in every integration.
"""
