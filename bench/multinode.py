"""``python -m bench.multinode``: runs bench/scenarios/multinode/scenario.py (see there)."""
import sys

from bench.scenarios.multinode.scenario import main

if __name__ == "__main__":
    sys.exit(main())
