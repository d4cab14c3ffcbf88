"""``lagom-jax bench``: a plan measured against XLA's defaults where the job runs.

The arms (``arms``) are plans made through the one pipeline (``lagom_jax.job``) and written as
plan folders; each arm runs as a fresh job under its own ``launch.sh`` (XLA_FLAGS, the NCCL
environment and the tuner plugin act only at process start), started the way the cluster
starts jobs (``launch``). Every process runs ``worker``; the arms are interleaved in rounds,
and ``stats`` and ``report`` say what was measured, with a 95% interval, beside what the cost
model predicted. ``run.bench`` is the whole of it; the CLI and Python call it.
"""
