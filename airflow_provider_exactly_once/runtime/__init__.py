"""How a task assembles the pieces: ``assembly`` builds the coordinator of a sink from its connections
and arms the faults from the environment; ``run_epochs`` gives a run its epoch and an incremental
epoch its reserved range. Hooks hold connections only; operators and the recovery DAG ask here."""
