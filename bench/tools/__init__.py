"""Diagnostic tools: measurements outside a run (breakdown, micro, seqread, soak)."""
