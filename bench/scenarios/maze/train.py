"""CLI: `python -m bench.scenarios.maze.train ...` (the implementation lives in bench.scenarios.maze.training).

Kept as a thin shim so that importing it never shadows the `bench.scenarios.maze.train` function:
import `bench.scenarios.maze.training` from code, run this module from the shell.
"""
import sys

from bench.scenarios.maze.training import main

if __name__ == "__main__":
    sys.exit(main())
