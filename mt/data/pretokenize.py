"""Moses pre-tokenization (`tokenizer.pretokenize=moses`), as fairseq's and Marian's preparation scripts do it, made
reversible with joiner marks (as OpenNMT's tokenizer does).

The text is Moses-tokenized (sacremoses, the Python port of Moses' tokenizer.perl) before the BPE learns and before
every encode, with the flags of fairseq's examples/translation/prepare-iwslt14.sh (no aggressive dash splitting:
"t-shirt" stays one token) and no escaping ("&" stays "&"). The language decides the rules (nonbreaking prefixes
such as "z.B.", English's "it 's"), so each side of a joint vocabulary has its own.

Moses' own detokenizer cannot undo everything its tokenizer splits (`/sbin/x` came back as `/ sbin / x`, `geht's`
as `geht 's`), so each split that Moses made where the text had no space is marked with a joiner "￭" on the side
of the punctuation: `geht's` -> `geht ￭'s`, `(dog)` -> `(￭ dog ￭)`, `mg/ml` -> `mg ￭/￭ ml`. The model learns the
joiners with the tokens, and a translation is detokenized by removing each joiner with the spaces around it: what
the model copies comes back exactly (up to runs of whitespace), and a prefix or a constraint means the same text
in the output as in the request. URLs, e-mail addresses, paths and placeholders (`%1`, `{0}`) are kept whole.

Models trained before the joiners (their pretokenize.json has no "joiner") keep Moses' detokenizer: `Moses(lang,
joiner=None)`; `round_trips` tells which texts survive it.
"""

from __future__ import annotations

import re
from functools import cache

JOINER = "\uffed"  # "￭", OpenNMT's joiner; NFC and lowercasing leave it alone
# Kept as one token (sacremoses' protected patterns): URLs, e-mail addresses, paths, placeholders, markup
PROTECTED = (
    r"(?:(?:https?|ftp|rsync)://|www\.)[^\s]*[^\s.,;:!?)\]}'\"]",  # a URL, without the sentence's punctuation after it
    r"[\w.+-]+@(?:[\w-]+\.)+[A-Za-z]{2,}",  # an e-mail address
    r"(?<![\w/])(?:~|\.{1,2})?(?:/[\w.+-]+){2,}/?",  # a Unix path of two or more parts: /usr/bin, ~/.config/x
    r"%\d+|%[sdif]|\{\d*\}|\$\{\w+\}|\$\d+",  # placeholders: %1 %s {0} {} ${name} $1
    r"</?\w[^<>\s]*/?>",  # a markup tag
)
_SPACES = re.compile(rf"\s*{JOINER}\s*")


class Moses:
    """Moses tokenization and detokenization of one language's text; with `joiner` (new models), reversible."""

    def __init__(self, lang: str, joiner: str | None = JOINER):
        from sacremoses import MosesDetokenizer, MosesTokenizer

        self.lang, self.joiner = lang, joiner
        self._tokenizer, self._detokenizer = MosesTokenizer(lang=lang), MosesDetokenizer(lang=lang)

    def _split(self, text: str) -> list[str]:
        protected = list(PROTECTED) if self.joiner is not None else None  # (a legacy model learnt without them)
        out = self._tokenizer.tokenize(text, escape=False, aggressive_dash_splits=False, protected_patterns=protected)
        return out

    def tokenize(self, text: str) -> str:
        if self.joiner is None:
            return " ".join(self._split(text))
        return " ".join(self._marked(text, self._split(text)))

    def _marked(self, text: str, tokens: list[str]) -> list[str]:
        """`tokens` (Moses' tokens of `text`) with a joiner wherever two of them touched in `text`: before a token
        that starts with a symbol, else after one that ends with a symbol, else before the second word."""
        out: list[str] = []
        pos = 0
        for token in tokens:
            start = pos
            while pos < len(text) and text[pos].isspace():
                pos += 1
            touching = pos == start and out
            if text.startswith(token, pos):
                pos += len(token)
            else:  # Moses changed the characters (it drops control characters): realign after the token
                found = text.find(token, pos)
                touching, pos = False, (found + len(token) if found >= 0 else pos)
            if touching:
                if not token[0].isalnum():
                    token = self.joiner + token
                elif not out[-1][-1].isalnum():
                    out[-1] += self.joiner
                else:
                    token = self.joiner + token
            out.append(token)
        return out

    def detokenize(self, text: str) -> str:
        if self.joiner is None:
            return self._detokenizer.detokenize(text.split(), unescape=False)
        return " ".join(_SPACES.sub(self.joiner, text).replace(self.joiner, "").split())

    def round_trips(self, text: str) -> bool:
        """Whether `text` comes back from tokenize -> detokenize as it is, up to runs of whitespace."""
        return self.detokenize(self.tokenize(text)).split() == text.split()


@cache
def moses(lang: str, joiner: str | None = JOINER) -> Moses:
    """One Moses per language and scheme (its regexes are compiled once)."""
    return Moses(lang, joiner)
