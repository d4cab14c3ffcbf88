"""The step as XLA compiles it: a user's jitted step whatever wraps it (``step``), compiling
for abstract GPUs (``gpu_compile``, ``hlo_compile``),
reading the HLO (``hlo``) into a StepGraph (``graph``), the custom calls XLA cannot compile
here (``custom_calls``), XLA flags checked against the installed XLA (``flags``), and every
use of JAX's private modules (``jax_internals``, ``environment``)."""
