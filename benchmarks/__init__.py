"""The lagom-jax benchmark suite (run as ``python -m benchmarks.<group>.<name>``)."""
