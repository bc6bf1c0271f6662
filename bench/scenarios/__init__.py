"""The scenarios: what a run measures (``registry``), and what each scenario runs in."""
