"""Decoding: a loaded model and text in, translations out.

Greedy, beam and sampling search (search.py), lexically constrained beam search (constraints.py) and glossaries
(terminology.py), ensembles (ensemble.py), CTranslate2 exports (ct2.py), batched decoding of token ids
(batched.py), sentence splitting (segment.py), reading input and writing output lines (lines.py), loading a
checkpoint for decoding (loading.py), and the `Translator` that joins them (translator.py), behind translate.py,
the Python API and the server. Imports model, data and the base modules."""
