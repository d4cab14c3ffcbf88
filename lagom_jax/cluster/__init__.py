"""The cluster a step runs on: its GPUs and links (``hardware``), the NCCL settings every
collective of a process shares (``nccl_env``), the per-collective NCCL choice the search
makes (``params``) and the measured collective times the model is anchored to
(``collective_tables``). Everything else builds on these; they import nothing above them."""
