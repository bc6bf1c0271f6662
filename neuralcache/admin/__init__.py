"""The operator surface: the CLI and its commands (mount, umount, stats, trace, warm),
the options table and config files, size strings, /proc/mounts parsing and the
Prometheus exporter.  The daemon (``neuralcache.daemon``) is started from here.
"""
