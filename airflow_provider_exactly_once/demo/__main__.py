"""``python -m airflow_provider_exactly_once.demo``: see ``demo.run``."""

from __future__ import annotations

import sys

from airflow_provider_exactly_once.demo.run import main

sys.exit(main())
