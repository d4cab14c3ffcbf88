"""Flax GPT-2, BERT and T5 with sharding recipes (installed as ``lagom_jax.models``)."""
