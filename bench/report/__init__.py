"""The report: a run's table and plots (``results``), the issue-10 targets (``targets``)."""
