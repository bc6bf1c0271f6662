"""``python -m bench.soak``: runs bench/tools/soak.py (see there)."""
import sys

from bench.tools.soak import main

if __name__ == "__main__":
    sys.exit(main())
