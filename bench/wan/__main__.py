"""python -m bench.wan ...: the WAN proxy from the command line (see bench/wan/process.py)."""
import sys

from .process import main

sys.exit(main())
