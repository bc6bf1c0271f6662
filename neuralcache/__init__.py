"""NeuralCache: predictive read-ahead caching FUSE filesystem for ML training."""
__version__ = "0.1.0"
