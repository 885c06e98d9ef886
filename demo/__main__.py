"""``python -m demo``: see ``demo.run``."""

from __future__ import annotations

import sys

from demo.run import main

sys.exit(main())
