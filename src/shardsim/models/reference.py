"""The single-device NumPy reference of the transformer (forward and hand-derived backward)."""
