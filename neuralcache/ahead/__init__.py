"""The speculative side: per-file read-ahead and the cross-file prefetch scheduler that
turns ``predictors/`` output and sampler hints into speculative loads on ``store``.
Nothing here can fail a read.
"""
