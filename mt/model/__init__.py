"""The model: token ids in, log-probabilities out.

The Transformer of "Attention Is All You Need" (transformer.py) with its decoder cache (cache.py), dropout
(dropout.py), attention kernels (fast_attention.py), int8 weights for CPU decoding (quantize.py) and the
label-smoothed loss (loss.py); saved.py reads a saved model (checkpoint, release, CTranslate2 export) back into a
model and its tokenizers. Imports data (the tokenizers' special ids) and the base modules."""
