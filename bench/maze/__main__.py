"""``python -m bench.maze ...``: runs bench/scenarios/maze/__main__.py (see there)."""
import sys

from bench.scenarios.maze.__main__ import main

sys.exit(main())
