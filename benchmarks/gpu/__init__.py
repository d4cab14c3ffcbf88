"""Run on a machine with one NVIDIA GPU: kernel rates, compile checks and the GPU wave."""
