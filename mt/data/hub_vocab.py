"""The tokenizers of transformers checkpoints, with the ids transformers gives, behind this project's `Vocab`
interface (encode and decode without specials; text is text):

| checkpoint          | files                                        | read with                                 |
|---|---|---|
| OPUS-MT (Marian)    | source.spm, target.spm, vocab.json           | `sentencepiece` (pieces), vocab.json (ids) |
|                     | (target_vocab.json: separate vocabularies)   |                                           |
| NLLB, other fast    | tokenizer.json                               | `tokenizers`                              |
| tokenizers          |                                              |                                           |

Marian's SentencePiece models are unigram models with their own normalization, which `tokenizers` holds only
approximately, so they are run by `sentencepiece` itself (what transformers' MarianTokenizer does). NLLB's
tokenizer.json is what transformers' NllbTokenizer runs. Language tokens are not text: they are the model's
input protocol (`Framing`): a multilingual OPUS-MT model reads the target language's `>>xxx<<` first in the
source; NLLB reads the source language's code first in the source and is forced to write the target language's
first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import astuple, dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from mt.data.tokenizer import Framing, Specials, Vocab, Vocabs
from mt.errors import TokenizerError

MARIAN_FILES = ("source.spm", "target.spm", "vocab.json")
SLOW_TOKENIZER_FILES = (
    "sentencepiece.bpe.model",
)  # NLLB's SentencePiece model, which transformers' slow tokenizer reads
HUB_TOKENIZER_FILE = "hub_tokenizer.json"  # beside the files of an export of this toolkit: their family and ids
NLLB_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")  # eng_Latn, deu_Latn, ...
MARIAN_CODE = re.compile(r">>[^<>\s]+<<")  # >>fra<<, >>pt_br<<, ...
# ISO 639-1 codes (this project's data.src_lang / tgt_lang) -> NLLB's; Marian's >>xxx<< codes are their first
# three letters (ISO 639-3) or the code itself.
NLLB_LANGUAGES = {
    "ar": "arb_Arab", "bg": "bul_Cyrl", "bn": "ben_Beng", "ca": "cat_Latn", "cs": "ces_Latn", "da": "dan_Latn",
    "de": "deu_Latn", "el": "ell_Grek", "en": "eng_Latn", "es": "spa_Latn", "et": "est_Latn", "eu": "eus_Latn",
    "fa": "pes_Arab", "fi": "fin_Latn", "fr": "fra_Latn", "ga": "gle_Latn", "gl": "glg_Latn", "he": "heb_Hebr",
    "hi": "hin_Deva", "hr": "hrv_Latn", "hu": "hun_Latn", "id": "ind_Latn", "is": "isl_Latn", "it": "ita_Latn",
    "ja": "jpn_Jpan", "ko": "kor_Hang", "lt": "lit_Latn", "lv": "lvs_Latn", "mk": "mkd_Cyrl", "mt": "mlt_Latn",
    "nl": "nld_Latn", "no": "nob_Latn", "pl": "pol_Latn", "pt": "por_Latn", "ro": "ron_Latn", "ru": "rus_Cyrl",
    "sk": "slk_Latn", "sl": "slv_Latn", "sr": "srp_Cyrl", "sv": "swe_Latn", "sw": "swh_Latn", "ta": "tam_Taml",
    "th": "tha_Thai", "tr": "tur_Latn", "uk": "ukr_Cyrl", "ur": "urd_Arab", "vi": "vie_Latn", "zh": "zho_Hans",
}  # fmt: skip


def require_sentencepiece():
    try:
        import sentencepiece
    except ImportError:
        raise TokenizerError("an OPUS-MT (Marian) tokenizer needs sentencepiece; pip install -e '.[pretrained]' "
                             "(or pip install sentencepiece)") from None  # fmt: skip
    return sentencepiece


class MarianVocab:
    """One side of a Marian tokenizer: its SentencePiece model cuts text into pieces, vocab.json gives their ids
    (a piece it lacks is <unk>, as in transformers). Decoding reads pieces back with `decoder` (the source model
    for a shared vocabulary, as transformers decodes)."""

    family = "marian"
    moses, case_markup, lowercases = None, False, False

    def __init__(self, model: bytes, ids: dict[str, int], specials: Specials, decoder: bytes | None = None):
        spm = require_sentencepiece()
        self.model, self.ids, self.specials = model, ids, specials
        self.sp = spm.SentencePieceProcessor(model_proto=model)
        self.sp_decode = self.sp if decoder is None else spm.SentencePieceProcessor(model_proto=decoder)
        self.pieces = {i: t for t, i in ids.items()}
        self.hidden = {specials.pad, specials.eos, specials.unk}  # transformers' skip_special_tokens

    def __len__(self) -> int:
        return len(self.ids)

    def shares_ids(self, other) -> bool:
        return isinstance(other, MarianVocab) and other.ids is self.ids

    def token_to_id(self, token: str) -> int | None:
        return self.ids.get(token)

    def id_to_token(self, i: int) -> str | None:
        return self.pieces.get(i)

    def get_vocab(self) -> dict[str, int]:
        return self.ids

    def added_tokens(self) -> dict[int, str]:
        return {}

    def pretokenized(self, texts: list[str]) -> list[str]:
        return texts

    def unchanged(self, text: str) -> str | None:
        return None

    def why_changed(self, text: str) -> str:
        return ""

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        unk = self.specials.unk
        return [[self.ids.get(p, unk) for p in pieces] for pieces in self.sp.encode(texts, out_type=str)]

    def unknown_spans(self, text: str) -> list[str]:
        return [p.lstrip("\u2581") for p in self.sp.encode(text, out_type=str) if p not in self.ids]

    def tokens(self, ids: list[int]) -> list[str]:
        return [self.pieces.get(i, "") for i in ids]

    def decode(self, ids: list[int]) -> str:
        return self.decode_batch([ids])[0]

    def decode_batch(self, batch: list[list[int]]) -> list[str]:
        out = []
        for ids in batch:
            pieces = [self.pieces[i] for i in ids if i not in self.hidden and i in self.pieces]
            out.append(self.sp_decode.decode_pieces(pieces).replace("\u2581", " ").strip())
        return out

    def digest(self, pretokenization: bool = True) -> str:
        h = hashlib.sha256(self.model)
        h.update(json.dumps(self.ids, sort_keys=True).encode())
        return h.hexdigest()[:16]


class FastVocab(Vocab):
    """A transformers fast tokenizer's tokenizer.json (NLLB's SentencePiece BPE with its fairseq offset) run by
    `tokenizers` as this project's own are, with the checkpoint's special ids."""

    family = "tokenizers"

    def __init__(self, tokenizer: Tokenizer, specials: Specials):
        self.specials = specials
        # transformers sets truncation and padding per call; a tokenizer.json may have been saved with them on
        tokenizer.no_truncation()
        tokenizer.no_padding()
        super().__init__(tokenizer)

    def check_specials(self) -> None:  # the checkpoint's ids, not this project's fixed ones
        pass

    def shares_ids(self, other) -> bool:
        return isinstance(other, FastVocab) and other.tokenizer is self.tokenizer


@dataclass
class HubVocabs(Vocabs):
    """A transformers checkpoint's tokenizers: `files` holds its tokenizer files as they were (written back by
    `save`), `languages` its language tokens ({code: id}: >>xxx<< for Marian, xxx_Xxxx for NLLB)."""

    family: str = "marian"
    files_: dict[str, str] = field(default_factory=dict)  # file name -> text (base64 for the .spm models)
    languages: dict[str, int] = field(default_factory=dict)

    @property
    def joint(self) -> bool:
        return self.src.shares_ids(self.tgt)

    @property
    def pretokenize(self) -> dict | None:
        return None

    def framing(self, src_lang: str | None, tgt_lang: str | None) -> Framing:
        """The special ids and language tokens of a pair `src_lang` -> `tgt_lang` (this project's two-letter codes
        or the checkpoint's own: de, deu, deu_Latn, >>deu<<); a language the model has no token for, or one it
        needs and was not given, is a one-line error."""
        specials = self.src.specials
        if not self.languages:
            return Framing(specials)
        if self.family == "marian":
            return Framing(specials, (self.language_id(tgt_lang, "tgt_lang"),))
        return Framing(specials, (self.language_id(src_lang, "src_lang"),), (self.language_id(tgt_lang, "tgt_lang"),))

    def language_id(self, lang: str | None, key: str) -> int:
        known = ", ".join(sorted(self.languages)[:12]) + (", ..." if len(self.languages) > 12 else "")
        if not lang:
            raise TokenizerError(f"{key} is needed by this multilingual model (its language tokens: {known})")
        for code in language_candidates(lang):
            if code in self.languages:
                return self.languages[code]
        raise TokenizerError(f"{key}={lang}: this model has no token for that language; give one of {known}")

    def files(self, dir: Path) -> dict[str, Path]:
        return {name: dir / name for name in self.files_}

    def save(self, dir: Path) -> None:
        """The tokenizer files as transformers reads them, and `HUB_TOKENIZER_FILE` naming them (how a release or
        a CTranslate2 export of this toolkit finds them again)."""
        dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.files_.items():
            if name.endswith(".spm") or name.endswith(".model"):
                (dir / name).write_bytes(base64.b64decode(text))
            else:
                (dir / name).write_text(text, encoding="utf-8")
        meta = {"family": self.family, "specials": list(astuple(self.src.specials)), "files": sorted(self.files_)}
        (dir / HUB_TOKENIZER_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    def to_json(self) -> dict:
        return {"family": self.family, "files": dict(self.files_), "specials": list(astuple(self.src.specials))}

    @classmethod
    def from_json(cls, d: dict) -> HubVocabs:
        return hub_vocabs(d["family"], d["files"], Specials(*d["specials"]))


def vocabs_from_json(d: dict) -> Vocabs:
    """Tokenizers as a checkpoint stores them (`to_json`): an imported checkpoint's family, or this project's."""
    return HubVocabs.from_json(d) if "family" in d else Vocabs.from_json(d)


def language_candidates(lang: str) -> list[str]:
    """The codes a checkpoint may spell `lang` with: as given, >>it<<, NLLB's xxx_Xxxx and ISO 639-3's xxx."""
    code = lang.strip()
    nllb = NLLB_LANGUAGES.get(code)
    out = [code, f">>{code}<<"]
    if nllb:
        out += [nllb, f">>{nllb[:3]}<<"]
    return out


def same_language(a: str, b: str) -> bool:
    """Whether two codes name one language in the spellings checkpoints use (de, deu, deu_Latn, >>deu<<)."""
    return bool(set(language_candidates(a)) & set(language_candidates(b))) or a.strip(">< ") == b.strip(">< ")


def readable(name: str, parse):
    """`parse()`, or a one-line TokenizerError naming the tokenizer file `name` that it could not read."""
    try:
        return parse()
    except TokenizerError:
        raise
    except Exception as e:  # json's, sentencepiece's and tokenizers' own errors (tokenizers raises Exception)
        detail = str(e).strip().splitlines()[0][:100] if str(e).strip() else type(e).__name__
        detail = "not a SentencePiece model" if name.endswith((".spm", ".model")) else detail
        raise TokenizerError(f"{name} is not readable ({detail}); the file is damaged or not the model's: copy it "
                             "again from the model's page") from None  # fmt: skip


def hub_vocabs(family: str, files: dict[str, str], specials: Specials) -> HubVocabs:
    """HubVocabs from the tokenizer files (`HubVocabs.files_`) of a `family` ("marian" or "tokenizers")."""
    if family == "marian":
        config = readable("tokenizer_config.json", lambda: json.loads(files.get("tokenizer_config.json", "{}")))
        ids = readable("vocab.json", lambda: dict(json.loads(files["vocab.json"])))
        source, target = (base64.b64decode(files[n]) for n in ("source.spm", "target.spm"))
        separate = bool(config.get("separate_vocabs"))
        tgt_ids = (
            readable("target_vocab.json", lambda: dict(json.loads(files["target_vocab.json"]))) if separate else ids
        )
        src = readable("source.spm", lambda: MarianVocab(source, ids, specials))
        # transformers decodes a shared vocabulary's output with the source model, separate ones with the target's
        tgt = readable(
            "target.spm", lambda: MarianVocab(target, tgt_ids, specials, decoder=None if separate else source)
        )
        languages = {} if separate else {t: i for t, i in ids.items() if MARIAN_CODE.fullmatch(t)}
        return HubVocabs(src, tgt, family, files, languages)
    if family == "tokenizers":
        tok = readable("tokenizer.json", lambda: Tokenizer.from_str(files["tokenizer.json"]))
        vocab = FastVocab(tok, specials)
        languages = {t: i for i, t in vocab.added_tokens().items() if NLLB_CODE.fullmatch(t)}
        return HubVocabs(vocab, vocab, family, files, languages)
    raise TokenizerError(f"tokenizer family {family!r}: unknown; this version reads marian and tokenizers")


def read_saved(dir: Path) -> dict:
    """The tokenizers `HubVocabs.save` wrote into an export dir, as `HubVocabs.to_json` gives them."""
    meta = json.loads((dir / HUB_TOKENIZER_FILE).read_text())
    files = {n: base64.b64encode((dir / n).read_bytes()).decode() if n.endswith((".spm", ".model"))
             else (dir / n).read_text(encoding="utf-8") for n in meta["files"]}  # fmt: skip
    return {"family": meta["family"], "files": files, "specials": meta["specials"]}


def read_hub_tokenizers(dir: Path, specials: Specials, where: str) -> HubVocabs:
    """The tokenizers of a transformers checkpoint dir: Marian's SentencePiece files, else a tokenizer.json; a
    missing file is a one-line error naming it."""
    text = lambda name: readable(name, lambda: (dir / name).read_text(encoding="utf-8"))  # noqa: E731

    def build(family: str, files: dict[str, str]) -> HubVocabs:
        try:
            return hub_vocabs(family, files, specials)
        except TokenizerError as e:
            raise TokenizerError(f"{where}: {e}") from None

    extra = [
        n for n in ("tokenizer_config.json", "special_tokens_map.json", "target_vocab.json") if (dir / n).is_file()
    ]
    if any((dir / n).is_file() for n in MARIAN_FILES):
        missing = [n for n in MARIAN_FILES if not (dir / n).is_file()]
        if missing:
            raise TokenizerError(f"{where}: {missing[0]} is missing; a Marian tokenizer needs "
                                 f"{', '.join(MARIAN_FILES)} (copy them from the model's page)")  # fmt: skip
        files = {n: base64.b64encode((dir / n).read_bytes()).decode() for n in MARIAN_FILES[:2]}
        files |= {n: text(n) for n in ("vocab.json", *extra)}
        if (
            readable("tokenizer_config.json", lambda: json.loads(files.get("tokenizer_config.json", "{}"))).get(
                "separate_vocabs"
            )
            and "target_vocab.json" not in files
        ):
            raise TokenizerError(f"{where}: target_vocab.json is missing (tokenizer_config.json says separate_vocabs)")
        return build("marian", files)
    if (dir / "tokenizer.json").is_file():
        files = {"tokenizer.json": text("tokenizer.json")} | {n: text(n) for n in extra}
        for name in SLOW_TOKENIZER_FILES:  # not read here; kept for the export back (the slow tokenizer reads it)
            if (dir / name).is_file():
                files[name] = base64.b64encode((dir / name).read_bytes()).decode()
        return build("tokenizers", files)
    raise TokenizerError(f"{where}: no tokenizer files (tokenizer.json, or Marian's {', '.join(MARIAN_FILES)}); "
                         "copy them from the model's page beside config.json")  # fmt: skip
