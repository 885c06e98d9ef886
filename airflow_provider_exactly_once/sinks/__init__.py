"""Sink committers behind one protocol (``core.ports.SinkCommitter``; design.md, 'The Iceberg commit' and 'The file-sink commit').

``config`` holds the typed sink configs a DAG author writes; ``layout`` where a write's files lie
until commit (imported by the Spark side too); ``files`` the file sink's committer; ``iceberg/`` the
Iceberg sink's; ``write_locations`` the write locations each kind lists for the orphan scan.
"""
