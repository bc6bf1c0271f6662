"""``python -m bench.trainfiles``: runs bench/scenarios/train_files.py (see there)."""
import sys

from bench.scenarios.train_files import main

if __name__ == "__main__":
    sys.exit(main())
