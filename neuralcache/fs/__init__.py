"""The FUSE edge: where a kernel request enters NeuralCache.

operations (the pyfuse3.Operations subclass and the one errno table), control (the
``.neuralcache/`` control directory), trace (the access trace ring).  Calls down into
``ahead`` (read-ahead), ``store`` (blocks) and ``namespace``; nothing below imports it.
"""
