"""Predictions against measurements: published runs and this project's own GPU runs."""
