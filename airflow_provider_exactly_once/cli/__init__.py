"""The ``eo-sink`` command-line tool (docs/cli.md): ``main`` runs a command, ``parser`` parses its
line and formats its answer, ``read_commands`` holds the commands that only read."""
