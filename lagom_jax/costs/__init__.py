"""What a step costs on a cluster: kernel rates (``kernels``), collective times and the
contention between compute and communication (``cost``), the host's launches and XLA's
command buffers (``launch``), the replay of a schedule (``simulate``), CommFuse's rings (``commfuse``), and fitting the model to a trace or a
GPU (``calibrate``, ``profile``)."""
