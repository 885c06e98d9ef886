"""The exactly-once core, one module to a concept: the coordinator (``coordinator``), the rules it
carries out (``decisions``), the ports it runs over (``ports``), the clean-up path (``cleanups``),
an epoch's names, numbers and history (``epochs``), a write's pre-commit and what it holds
(``precommit``, ``data_file_list``, ``upserts``, ``input_ranges``), what steps report
(``outcomes``, ``delivery``), the errors (``errors``) and the fault hook's plug point (``faults``).

It imports neither Airflow, Spark nor the package's other layers, so the whole protocol can be
tested and reasoned about without them. The map: design.md, "Layers".
"""
