"""The lagom-jax NCCL tuner plugin: C source and the helper that builds it."""
