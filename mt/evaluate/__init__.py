"""Evaluation: translations and references in, scores and reports out.

Validation loss and BLEU (scoring.py), sacreBLEU/chrF scores and reports (report.py), paired significance between
systems (compare.py, `python -m mt.compare`), training curves and attention plots (plots.py), and translate.py's two
ways through an input file, with a report when references are given (translate_files.py). Imports decode, model,
data and the base modules."""
