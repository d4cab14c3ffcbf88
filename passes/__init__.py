"""Graph passes over the StepGraph (installed as ``lagom_jax.passes``)."""
