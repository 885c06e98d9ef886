"""Triggers run by Airflow's triggerer for the deferrable sensors."""

from airflow_provider_exactly_once.triggers.checkpoint import CheckpointTrigger

__all__ = ["CheckpointTrigger"]
