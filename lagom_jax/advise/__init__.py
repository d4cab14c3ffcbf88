"""Advice on a whole configuration: ConfigTuner's mesh, batch and micro-batch advice
(``configtuner``), the Megatron-LM step predictor (``megatron``) and the prediction contract
for the built-in families (``predict``)."""
