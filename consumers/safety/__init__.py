"""The input and output safety checks: one classifier interface (``classifier.py``), the embedded
default and a model-pool implementation, the streaming output check, and their metrics."""
