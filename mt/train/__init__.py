"""Training: a prepared corpus and a config in, checkpoints and a scored run dir out.

The trainer (trainer.py) with its schedules (schedules.py), regularizers (regularize.py), weight EMA (ema.py),
metrics (metrics.py), DDP (distributed.py), checkpoints for exact resume and averaging (checkpoint.py),
fine-tuning from a trained model (finetune.py), the end of a run: averaging, test reports, plots (finish.py),
and what a run records for later stages (records.py). Imports evaluate, decode, model, data and the base
modules."""
