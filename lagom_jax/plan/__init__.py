"""From a search to a job: the Plan (``schema``), made from the strategies' results
(``planning``) with the whole-step choices priced by compiling (``structures``) or by the
model (``nccl_settings``), checked by compiling again (``verify``), and delivered as files
(``artifacts``, ``nccl_tuner``, ``cache``, ``sharing``) and as tables and pictures
(``report``, ``trace``)."""
