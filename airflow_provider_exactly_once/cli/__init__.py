"""The ``eo-sink`` command-line tool (``cli.main``)."""
