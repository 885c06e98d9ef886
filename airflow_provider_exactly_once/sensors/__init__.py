"""Sensors: waiting for an epoch's checkpoint."""

from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor, CheckpointSettledSensor

__all__ = ["CheckpointSensor", "CheckpointSettledSensor"]
