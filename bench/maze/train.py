"""CLI: `python -m bench.maze.train ...` (the implementation lives in bench.maze.training).

Kept as a thin shim so that importing it never shadows the `bench.maze.train` function:
import `bench.maze.training` from code, run this module from the shell.
"""
import sys

from bench.maze.training import main

if __name__ == "__main__":
    sys.exit(main())
