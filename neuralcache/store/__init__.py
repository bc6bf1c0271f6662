"""Where a read gets its bytes: the block store (single-flight loads, priorities), the
cache tiers it looks in (memory, disk) and the backend request limiter.  Calls down into
``backends`` only.
"""
