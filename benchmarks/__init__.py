"""The lagom-jax benchmark suite (run as ``python -m benchmarks.<name>``)."""
