"""``python -m bench.seqread``: runs bench/tools/seqread.py (see there)."""
import sys

from bench.tools.seqread import main

if __name__ == "__main__":
    sys.exit(main())
