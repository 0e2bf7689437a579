"""Subword vocabularies: BPE trained with Hugging Face `tokenizers`, saved as `tokenizer.json` in the run dir.

Metaspace turns spaces into a visible marker (as SentencePiece does) and its decoder turns them back, and the
punctuation split only cuts between characters, so `decode(encode(s)) == s` for any NFC text whose characters
were seen in training (with the default normalization; "NFC+Lowercase" lowercases on the way in; with case markup,
mt/data/casing.py, the BPE sees lowercase words and marks, and the output is cased again). Special tokens
take fixed ids: <pad>=0, <unk>=1, <s>=2, </s>=3; their text in an input is plain text, never the special id.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from mt.config import TokenizerConfig
from mt.data import casing
from mt.data.alphabet import alphabet_limit
from mt.data.pretokenize import JOINER, Moses, moses
from mt.errors import TokenizerError

log = logging.getLogger(__name__)

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")
PRETOKENIZE_FILE = "pretokenize.json"  # beside tokenizer.json: tokenizer.pretokenize's setting and languages
# What a real "■" (U+25A0) becomes before Moses where the normalization (NFKC, NFKD) folds the joiner "￭" into "■":
# a private-use character no normalization changes, "■" again after decoding.
FOLDED = "\ue0c3"


def protect(text: str, joiner_in_tokens: str | None, joiner: str | None) -> str:
    """`text` before Moses: its real `joiner_in_tokens` characters as FOLDED where the normalization makes the
    joiner into one of them (else as it is), so that decoding does not take them for joiners."""
    return text.replace(joiner_in_tokens, FOLDED) if joiner and joiner_in_tokens != joiner else text


def folded_joiner(normalization: str) -> str:
    """What the normalization `normalization` ("NFC", "NFKC+Lowercase", ...) makes of the joiner."""
    return new_tokenizer(normalization).normalizer.normalize_str(JOINER)


PAD, UNK, BOS, EOS = 0, 1, 2, 3


@dataclass(frozen=True)
class Specials:
    """A model's special token ids (model.pad_id, unk_id, decoder_start_id, eos_id): this project's tokenizers'
    fixed ones by default, another toolkit's for an imported model (Marian: </s> 0, <unk> 1, <pad> last and the
    decoder's first token; NLLB: <pad> 1, </s> 2 and the decoder's first token, <unk> 3)."""

    pad: int = PAD
    unk: int = UNK
    start: int = BOS
    eos: int = EOS

    @classmethod
    def of(cls, model_cfg) -> Specials:
        """The ids of a ModelConfig (this project's where it names none: a test's oracle model)."""
        ids = ("pad_id", "unk_id", "decoder_start_id", "eos_id")
        return cls(*(getattr(model_cfg, name, default) for name, default in zip(ids, (PAD, UNK, BOS, EOS))))

    @property
    def never(self) -> tuple[int, ...]:
        """Ids a search never outputs: <pad>, and the decoder's first token unless it is </s> (NLLB's)."""
        return (self.pad,) if self.start in (self.pad, self.eos) else (self.pad, self.start)


@dataclass(frozen=True)
class Framing:
    """How a pair's subword ids become the model's input: the special ids, and the language tokens some imported
    models read (a multilingual OPUS-MT model: the target language's >>xx<< first in the source; NLLB: the source
    language's code first in the source, the target language's first in the target, forced when decoding)."""

    specials: Specials = Specials()
    src_lead: tuple[int, ...] = ()
    tgt_lead: tuple[int, ...] = ()


PAPER_FRAMING = Framing()  # this project's own models: fixed ids, no language tokens


class Vocab:
    """One BPE tokenizer: text <-> ids without special tokens (the model adds <s> and </s> itself). With `moses`
    (tokenizer.pretokenize=moses), text is Moses-tokenized in its language before the BPE and detokenized after;
    with `case_markup` (tokenizer.case_markup), lowercased with case marks (after Moses) and cased again."""

    specials = Specials()  # this project's fixed ids (an imported tokenizer's differ: mt/data/hub_vocab.py)
    family = "bpe"

    def __init__(self, tokenizer: Tokenizer, moses: Moses | None = None, case_markup: bool = False):
        self.tokenizer, self.moses, self.case_markup = tokenizer, moses, case_markup
        # Text is text: "<pad>", "</s>" or "<2fr>" typed in an input are split like any other characters, never
        # matched as the special token (which would mask a source as padding, end a prefix or pick a language).
        # The model's specials come from ids, not from text. (A setting of the object, not saved in the JSON.)
        tokenizer.encode_special_tokens = True
        # What the joiner becomes in the tokens: NFKC and NFKD fold "￭" into "■", which the output then holds.
        normalizer = tokenizer.normalizer
        joiner = moses.joiner if moses is not None else None
        self._joiner_in_tokens = normalizer.normalize_str(joiner) if joiner and normalizer is not None else joiner
        self.check_specials()

    def check_specials(self) -> None:
        for i, tok in enumerate(SPECIALS):
            if self.tokenizer.token_to_id(tok) != i:
                raise TokenizerError(f"tokenizer has {tok} at id {self.tokenizer.token_to_id(tok)}, expected {i}")

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size()

    def shares_ids(self, other) -> bool:
        return getattr(other, "tokenizer", None) is self.tokenizer

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self.tokenizer.id_to_token(i)

    def get_vocab(self) -> dict[str, int]:
        """{token: id} of every type, special ones included."""
        return self.tokenizer.get_vocab()

    def added_tokens(self) -> dict[int, str]:
        """{id: token} of the tokens added whole (the specials, tags such as <2de> or <bt>)."""
        return {i: t.content for i, t in self.tokenizer.get_added_tokens_decoder().items()}

    def unknown_spans(self, text: str) -> list[str]:
        """The pieces of `text` (as the BPE sees it) that become <unk>: what the vocabulary lacks."""
        seen = self.pretokenized([text])[0]
        enc = self.tokenizer.encode(seen, add_special_tokens=False)
        return [seen[a:b] for i, (a, b) in zip(enc.ids, enc.offsets) if i == self.specials.unk]

    def pretokenized(self, texts: list[str]) -> list[str]:
        """`texts` as the BPE sees them: Moses-tokenized with `moses`, case-marked with `case_markup`."""
        if self.moses is not None:
            texts = [self.moses.tokenize(protect(t, self._joiner_in_tokens, self.moses.joiner)) for t in texts]
        return [casing.mark(t) for t in texts] if self.case_markup else texts

    def unchanged(self, text: str) -> str | None:
        """None if `text` comes back as it is (up to runs of whitespace) from this tokenizer's pre-tokenization and
        its undoing (always without Moses, unless case markup drops a character of its marks), else what comes
        back: what a prefix or a constraint would become."""
        if self.case_markup and any(m in text for m in casing.MARKS):
            return self.unchanged(text.translate(casing.STRAY)) or text.translate(casing.STRAY)
        if self.moses is None or self.moses.round_trips(text):
            return None
        return self.moses.detokenize(self.moses.tokenize(text))

    def why_changed(self, text: str) -> str:
        """What to tell a user whose `text` this tokenizer would not give back (`unchanged`)."""
        if self.case_markup and any(m in text for m in casing.MARKS):
            return "case markup removes the characters U+E0C1 and U+E0C2 (its marks); remove them"
        return ("this model's Moses pre-tokenization changes it; rephrase it, or retrain the model (new Moses models "
                "give text back exactly)")  # fmt: skip

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(self.pretokenized([text])[0], add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.21) skips the character offsets, which nothing here reads.
        encode = getattr(self.tokenizer, "encode_batch_fast", self.tokenizer.encode_batch)
        return [e.ids for e in encode(self.pretokenized(texts), add_special_tokens=False)]

    def tokens(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.decode_batch([ids])[0]

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        texts = self.tokenizer.decode_batch(batch, skip_special_tokens=True)
        if self.case_markup:
            texts = [casing.restore(t) for t in texts]
        if self.moses is None:
            return texts
        if self._joiner_in_tokens != self.moses.joiner:  # NFKC and NFKD: the joiner became "■"; real ones came as
            texts = [t.replace(self._joiner_in_tokens, self.moses.joiner) for t in texts]  # FOLDED (`protect`)
            return [self.moses.detokenize(t).replace(FOLDED, self._joiner_in_tokens) for t in texts]
        return [self.moses.detokenize(t) for t in texts]

    @property
    def lowercases(self) -> bool:
        """The tokenizer lowercases its input (a lowercased model: its output is lowercase)."""
        norm = self.tokenizer.normalizer
        return norm is not None and norm.normalize_str("A") == "a"

    def digest(self, pretokenization: bool = True) -> str:
        """The tokenizer's identity (what ids its text gets): its JSON, and its pre-tokenization if any (unless
        `pretokenization` is False: the tokenizer.json file's identity)."""
        moses = self.moses if pretokenization else None
        text = self.tokenizer.to_str() + (f"|moses:{moses.lang}" if moses is not None else "")
        text += "|case_markup" if pretokenization and self.case_markup else ""
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | Path, moses: Moses | None = None) -> Vocab:
        try:
            return cls(Tokenizer.from_file(str(path)), moses)
        except Exception as e:
            raise TokenizerError(f"{path}: not a usable tokenizer.json ({e}); delete it to retrain") from None


def with_bpe_dropout(vocab: Vocab, p: float) -> Tokenizer:
    """A copy of `vocab`'s tokenizer that skips each BPE merge with probability `p` (for training data only)."""
    tok = Tokenizer.from_str(vocab.tokenizer.to_str())
    tok.model.dropout = p
    tok.encode_special_tokens = True  # as Vocab's
    return tok


@dataclass
class Vocabs:
    """Source and target vocabularies; one shared tokenizer when the vocabulary is joint (one shared object too,
    unless each side pre-tokenizes in its own language)."""

    src: Vocab
    tgt: Vocab

    @property
    def joint(self) -> bool:
        return self.src.tokenizer is self.tgt.tokenizer

    @property
    def family(self) -> str:
        """Whose tokenizers: "bpe" (this project's), or an imported checkpoint's (mt/data/hub_vocab.py)."""
        return "bpe"

    def framing(self, src_lang: str | None = None, tgt_lang: str | None = None) -> Framing:
        """The special ids and language tokens of a pair (this project's: fixed ids; a multilingual model's <2xx>
        tokens are put before its sources by the corpus and the translator)."""
        return Framing()

    @property
    def pretokenize(self) -> dict | None:
        """How text is prepared before the BPE: {"kind": "moses", "src_lang": .., "tgt_lang": .., "joiner": ..},
        with "case_markup": true when words are case-marked ({"kind": "none", "case_markup": true} without Moses);
        None when text goes to the BPE as it is."""
        case = {"case_markup": True} if self.src.case_markup else {}
        if self.src.moses is None:
            return {"kind": "none", **case} if case else None
        joiner = {"joiner": self.src.moses.joiner} if self.src.moses.joiner is not None else {}  # (none: legacy)
        return {"kind": "moses", "src_lang": self.src.moses.lang, "tgt_lang": self.tgt.moses.lang, **joiner, **case}

    def files(self, dir: Path) -> dict[str, Path]:
        if self.joint:
            return {"joint": dir / "tokenizer.json"}
        return {"src": dir / "tokenizer.src.json", "tgt": dir / "tokenizer.tgt.json"}

    def save(self, dir: Path) -> None:
        """The tokenizer files, and `PRETOKENIZE_FILE` beside them when text is pre-tokenized (else none: an old
        one is removed, so the directory describes these tokenizers alone)."""
        dir.mkdir(parents=True, exist_ok=True)
        for side, path in self.files(dir).items():
            (self.src if side in ("joint", "src") else self.tgt).tokenizer.save(str(path))
        if self.pretokenize is not None:
            (dir / PRETOKENIZE_FILE).write_text(json.dumps(self.pretokenize) + "\n")
        else:
            (dir / PRETOKENIZE_FILE).unlink(missing_ok=True)

    def to_json(self) -> dict:
        """The tokenizers as JSON strings, stored inside checkpoints so a checkpoint is self-contained."""
        d = {"src": self.src.tokenizer.to_str(), "tgt": None if self.joint else self.tgt.tokenizer.to_str()}
        return d | ({"pretokenize": self.pretokenize} if self.pretokenize is not None else {})

    @classmethod
    def from_json(cls, d: dict) -> Vocabs:
        src = Tokenizer.from_str(d["src"])
        tgt = src if d["tgt"] is None else Tokenizer.from_str(d["tgt"])
        return cls.of(src, tgt, d.get("pretokenize"))

    @classmethod
    def of(cls, src: Tokenizer, tgt: Tokenizer, pretokenize: dict | None = None) -> Vocabs:
        """Vocabs over the tokenizers `src` and `tgt` (the same object: joint), pre-tokenizing as `pretokenize`
        (`Vocabs.pretokenize`'s form) says."""
        pretokenize = pretokenize or {"kind": "none"}
        case = pretokenize.get("case_markup", False)
        if case not in (True, False) or pretokenize.get("kind") not in ("none", "moses"):
            raise TokenizerError(f"pretokenize={pretokenize!r}: unknown; this version knows moses and case_markup")
        if pretokenize["kind"] == "none":
            vocab = Vocab(src, case_markup=case)
            return cls(vocab, vocab if tgt is src else Vocab(tgt, case_markup=case))
        joiner = pretokenize.get("joiner")  # (a model of before the joiners: Moses' detokenizer)
        if joiner is None:
            log.warning(
                "pretokenize: a Moses model without joiner marks: its translations are Moses-detokenized, "
                "which does not give all text back as the model copies it (retrain for exact text)"
            )
        src_moses, tgt_moses = moses(pretokenize["src_lang"], joiner), moses(pretokenize["tgt_lang"], joiner)
        return cls(Vocab(src, src_moses, case), Vocab(tgt, tgt_moses, case))

    def pretokenizing(self, kind: str, src_lang: str, tgt_lang: str, case_markup: bool = False) -> Vocabs:
        """These tokenizers with `tokenizer.pretokenize=kind` in the run's languages ("none": as they are) and
        `tokenizer.case_markup`."""
        spec: dict = {"kind": kind}
        if kind != "none":
            spec |= {"src_lang": src_lang, "tgt_lang": tgt_lang, "joiner": JOINER}
        if case_markup:
            spec["case_markup"] = True
        return Vocabs.of(self.src.tokenizer, self.tgt.tokenizer, spec)


# What `pre_tokenizers.Punctuation` splits off: Unicode punctuation and ASCII's symbols
PUNCTUATION = r"\p{P}|[$+<=>^`|~]"


def new_tokenizer(normalization: str, pretokenized: bool = False) -> Tokenizer:
    """An untrained BPE tokenizer; `normalization` as `tokenizer.normalization` ("NFC", "NFC+Lowercase").
    `pretokenized`: for text Moses-tokenized before it (`tokenizer.pretokenize=moses`)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    steps = [getattr(normalizers, name)() for name in normalization.split("+")]
    tok.normalizer = steps[0] if len(steps) == 1 else normalizers.Sequence(steps)
    # Spaces become "▁" (kept on the following word); punctuation is split off so that "dog." and "dog" share
    # a subword, which matters on small corpora. Both steps are undone exactly by the Metaspace decoder.
    split = pre_tokenizers.Punctuation(behavior="isolated")
    if pretokenized:
        # Moses puts a space before every punctuation mark ("bushes ￭."): the mark keeps its "▁" and its joiners
        # ("▁￭."), as a word of subword-nmt would. Split off alone, each mark would cost a bare "▁" token too (9% of
        # Multi30k's German tokens).
        split = pre_tokenizers.Split(Regex(f"▁?{JOINER}?(?:{PUNCTUATION}){JOINER}?"), behavior="isolated")
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), split])
    tok.decoder = decoders.Metaspace()
    return tok


def sample_pairs(pairs: Iterable[tuple[str, str]], k: int, seed: int = 0) -> tuple[list[tuple[str, str]], int]:
    """A uniform random sample of `k` pairs (all of them if there are fewer; k = 0: all) in one pass, and the number
    of pairs seen. Reservoir sampling with geometric skips (Li's algorithm L), so a corpus of millions costs a few
    thousand random draws beyond reading it."""
    it = iter(pairs)
    sample = list(itertools.islice(it, k)) if k else list(it)
    seen = len(sample)
    if not k or seen < k:
        return sample, seen
    rng = random.Random(seed)
    w = math.exp(math.log(rng.random()) / k)
    while True:
        skip = int(math.log(rng.random()) / math.log(1 - w))
        taken = list(itertools.islice(it, skip + 1))
        seen += len(taken)
        if len(taken) <= skip:
            return sample, seen
        sample[rng.randrange(k)] = taken[-1]
        w *= math.exp(math.log(rng.random()) / k)


def balanced_sample(languages: list[tuple[Iterable[tuple[str, str]], str, str]], k: int) -> dict[str, list[str]]:
    """Up to `k` sentences of each language, from the first direction it appears in: in [en-de, en-fr, en-cs] English
    is one language of four, not half of the text as in the directions' pairs."""
    out: dict[str, list[str]] = {}
    for pairs, src, tgt in languages:
        if src in out and tgt in out:
            continue
        sample, _ = sample_pairs(pairs, k)
        for side, lang in ((0, src), (1, tgt)):
            out.setdefault(lang, [p[side] for p in sample])
    return out


def train_vocab(
    cfg: TokenizerConfig, pairs: list[tuple[str, str]], sides: tuple[int, ...], tags: tuple[str, ...] = ()
) -> Vocab:
    """BPE on the sentences of `pairs` (side 0: source, 1: target), fed in chunks of 2,000 pairs, side by side.
    `tags`: special tokens after the four fixed ones (a corpus's tag, e.g. <bt>), each one id."""
    texts = ([p[side] for p in pairs[i : i + 2000]] for i in range(0, len(pairs), 2000) for side in sides)
    return train_vocab_on(cfg, texts, len(pairs) * len(sides), tags)


def train_vocab_on(cfg: TokenizerConfig, texts: Iterable[list[str]], n: int, tags: tuple[str, ...] = ()) -> Vocab:
    """BPE on `texts`, chunks of sentences (`n` sentences in all); see `train_vocab`."""
    texts = list(texts)
    tok = new_tokenizer(cfg.normalization, pretokenized=cfg.pretokenize == "moses")
    limit = alphabet_limit(cfg, texts)
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=[*SPECIALS, *tags],
        show_progress=False,
        **({"limit_alphabet": limit} if limit is not None else {}),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=n)
    return Vocab(tok)


def load_run_vocabs(cfg: TokenizerConfig, run_dir: Path) -> Vocabs:
    """The tokenizers a directory holds (a run dir, a release, an export), with its `PRETOKENIZE_FILE` if any."""
    if cfg.joint:
        src = tgt = Vocab.from_file(run_dir / "tokenizer.json").tokenizer
    else:
        src = Vocab.from_file(run_dir / "tokenizer.src.json").tokenizer
        tgt = Vocab.from_file(run_dir / "tokenizer.tgt.json").tokenizer
    return Vocabs.of(src, tgt, read_pretokenize(run_dir))


def read_pretokenize(dir: Path) -> dict | None:
    """The pre-tokenization recorded beside a directory's tokenizer files (`Vocabs.save`), or None."""
    path = dir / PRETOKENIZE_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise TokenizerError(f"{path}: not readable JSON ({e}); restore it from the run or re-export") from None


def read_tokenizer_files(dir: Path) -> dict:
    """The tokenizers of an exported model dir as checkpoints store them (`Vocabs.to_json`: JSON strings, and the
    pre-tokenization recorded beside them)."""
    pretokenize = read_pretokenize(dir)
    extra = {"pretokenize": pretokenize} if pretokenize is not None else {}
    if (dir / "tokenizer.json").is_file():
        return {"src": (dir / "tokenizer.json").read_text(), "tgt": None, **extra}
    return {"src": (dir / "tokenizer.src.json").read_text(), "tgt": (dir / "tokenizer.tgt.json").read_text(), **extra}
