"""Predicted suites: the cost model and the search on built-in cells, with no measurement."""
