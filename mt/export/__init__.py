"""Export: a trained run in, a deployable model out.

A release (safetensors + JSON, no pickle) or a CTranslate2 model (formats.py, `python -m mt.export`), written
into a directory that a failed or repeated export cannot damage (export_dir.py), with a model card
(model_card.py). Imports train (a run's records) and the stages below it."""
