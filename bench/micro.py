"""``python -m bench.micro``: runs bench/tools/micro.py (see there)."""
import sys

from bench.tools.micro import main

if __name__ == "__main__":
    sys.exit(main())
