"""``python -m bench.maze``: the command; the maze scenario and its data are bench/scenarios/maze/."""
