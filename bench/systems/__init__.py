"""The systems under test: the mounts and the library peers behind one interface."""
