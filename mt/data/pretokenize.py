"""Moses pre-tokenization (`tokenizer.pretokenize=moses`), as fairseq's and Marian's preparation scripts do it.

The text is Moses-tokenized (sacremoses, the Python port of Moses' tokenizer.perl) before the BPE learns and
before every encode, and a translation is Moses-detokenized after decoding, so that every door (translate.py, the
Python API, the server and its page, a CTranslate2 export) still reads and writes raw text. The flags are those of
fairseq's examples/translation/prepare-iwslt14.sh and of benchmarks/peers/fairseq/run.sh: no aggressive dash
splitting ("t-shirt" stays one token). Characters are not escaped ("&" is not "&amp;"): the escapes are a mapping
one to one that the BPE does not need, and the detokenizer would have to undo them. The language decides the rules
(nonbreaking prefixes such as "z.B.", English's "it 's" against the other languages' "it ' s"), so the source and
the target of a joint vocabulary each have their own.
"""

from __future__ import annotations

from functools import cache


class Moses:
    """Moses tokenization and detokenization of one language's text."""

    def __init__(self, lang: str):
        from sacremoses import MosesDetokenizer, MosesTokenizer

        self.lang = lang
        self._tokenizer, self._detokenizer = MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)

    def tokenize(self, text: str) -> str:
        return self._tokenizer.tokenize(text, escape=False, aggressive_dash_splits=False, return_str=True)

    def detokenize(self, text: str) -> str:
        return self._detokenizer.detokenize(text.split(), unescape=False)


@cache
def moses(lang: str) -> Moses:
    """One Moses per language (its regexes are compiled once)."""
    return Moses(lang)
