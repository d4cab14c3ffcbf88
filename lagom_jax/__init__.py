"""lagom-jax: contention-aware tuning of communication/computation overlap in JAX."""

__version__ = "0.1.0"
