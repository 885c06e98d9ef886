"""Sensors: waiting for an epoch's checkpoint (``checkpoint``: ``CheckpointSensor`` and
``CheckpointSettledSensor``)."""

from airflow_provider_exactly_once.sensors.checkpoint import CheckpointSensor, CheckpointSettledSensor

__all__ = ["CheckpointSensor", "CheckpointSettledSensor"]
