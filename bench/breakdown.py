"""``python -m bench.breakdown``: runs bench/tools/breakdown.py (see there)."""
import sys

from bench.tools.breakdown import main

if __name__ == "__main__":
    sys.exit(main())
