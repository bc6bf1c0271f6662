"""The servers a run starts: SeaweedFS, one process (``seaweed``) or a cluster (``cluster``)."""
