"""How a task assembles the pieces: the coordinator of a sink from its connections, and the faults
armed from the environment. Hooks hold connections only; operators and the recovery DAG ask here."""
