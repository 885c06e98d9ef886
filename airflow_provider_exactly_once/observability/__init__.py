"""What the provider tells the rest of a deployment: metrics through Airflow's ``Stats``, OpenLineage
datasets, Airflow Asset events for committed tables, and the operators' links to the epoch view.

Each submodule imports what it needs lazily where the import is costly (OpenLineage), so importing
an operator does not pull in every integration.
"""
