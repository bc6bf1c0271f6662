"""``python -m bench.targets``: runs bench/report/targets.py (see there)."""
import sys

from bench.report.targets import main

if __name__ == "__main__":
    sys.exit(main())
