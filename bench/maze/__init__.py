"""``python -m bench.maze``: the command; the maze scenario is bench/scenarios/maze/."""
