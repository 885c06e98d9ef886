"""Exactly-once delivery into Iceberg and file sinks, driven by Airflow."""
