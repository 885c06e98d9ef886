"""Sink committers behind one protocol (``core.ports.SinkCommitter``): Iceberg tables and file sinks."""
