"""Data: parallel text in, batches of token ids out.

Reads text files line by line (files.py) and corpora (local files, .gz, Hugging Face datasets), with their filters
(read.py), holds out a validation set (holdout.py), Moses-tokenizes (pretokenize.py) and trains or loads the BPE
tokenizers (tokenizer.py), assembles them into a tokenized, cached corpus (corpus.py) and cuts it into
length-bucketed, token-budget batches (batching.py), with BPE-dropout's per-epoch segmentations (bpe_dropout.py).
`python -m mt.prepare` runs it alone. Imports only the base modules of mt/ (config, errors, runtime, run_dir)."""
