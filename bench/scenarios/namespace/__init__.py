"""The ``namespace`` scenario (issue 19): trees.py makes and keeps the trees,
scenario.py measures."""
