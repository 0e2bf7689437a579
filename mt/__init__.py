"""A Transformer translation toolkit. `from mt import Translator` for translating from Python
(mt/decode/translator.py); docs/layout.md for the packages, one per stage."""


def __getattr__(name: str):
    # Lazy, so that the entry points' first import (mt.cli, which answers a bad command line before torch loads)
    # does not load torch.
    if name == "Translator":
        from mt.decode.translator import Translator

        return Translator
    raise AttributeError(f"module 'mt' has no attribute {name!r}")
