"""The multinode scenario (issue 13): four NeuralCache nodes, one shared tier (``scenario``)."""
