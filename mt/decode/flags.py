"""Named flags for the ways neural MT output goes wrong, computed per line from the source, the output and what
the search knew (mt/decode/confidence.py puts them beside each line's score):

    loop          an n-gram (1 to 4 words) repeated back to back: 4 times for a word, 3 for a longer n-gram
    copy          the output is the source again (>= 3 words, character similarity >= 0.9, case and punctuation
                  ignored)
    length_ratio  output/source length (in tokens) outside the range the model's training pairs show (the
                  0.5th to 99.5th percentile, kept with the run; a model with no training record here, such as
                  an imported one, is not flagged)
    length_limit  the search stopped at the line's length limit (decode.max_len_a/max_len_b, the positions)
    script        most letters are not in the target language's script (Unicode script counts; a language whose
                  script is not known here is not flagged)
    low_score     the score is under `flag_below`

Each flag is a plain rule, cheap enough to run on every line; none needs a model or weights from a hub.
"""

from __future__ import annotations

import difflib
import re
import unicodedata

import numpy as np

FLAGS = ("loop", "copy", "length_ratio", "length_limit", "script", "low_score")

# The scripts a language is written in, by its ISO 639-1 (or -3) code; NLLB codes carry theirs (deu_Latn).
SCRIPT_OF_CODE = {
    "Latn": {"LATIN"}, "Cyrl": {"CYRILLIC"}, "Grek": {"GREEK"}, "Arab": {"ARABIC"}, "Hebr": {"HEBREW"},
    "Hans": {"CJK"}, "Hant": {"CJK"}, "Jpan": {"CJK", "HIRAGANA", "KATAKANA"}, "Hang": {"HANGUL"},
    "Kore": {"HANGUL", "CJK"}, "Deva": {"DEVANAGARI"}, "Beng": {"BENGALI"}, "Thai": {"THAI"},
    "Geor": {"GEORGIAN"}, "Armn": {"ARMENIAN"}, "Taml": {"TAMIL"}, "Telu": {"TELUGU"}, "Gujr": {"GUJARATI"},
    "Knda": {"KANNADA"}, "Mlym": {"MALAYALAM"}, "Guru": {"GURMUKHI"}, "Sinh": {"SINHALA"}, "Khmr": {"KHMER"},
    "Laoo": {"LAO"}, "Mymr": {"MYANMAR"}, "Ethi": {"ETHIOPIC"},
}  # fmt: skip
NON_LATIN = {
    "ru": "Cyrl", "uk": "Cyrl", "bg": "Cyrl", "sr": "Cyrl", "mk": "Cyrl", "be": "Cyrl", "kk": "Cyrl", "el": "Grek",
    "ar": "Arab", "fa": "Arab", "ur": "Arab", "he": "Hebr", "zh": "Hans", "ja": "Jpan", "ko": "Kore", "hi": "Deva",
    "mr": "Deva", "ne": "Deva", "bn": "Beng", "th": "Thai", "ka": "Geor", "hy": "Armn", "ta": "Taml", "te": "Telu",
    "gu": "Gujr", "kn": "Knda", "ml": "Mlym", "pa": "Guru", "si": "Sinh", "km": "Khmr", "lo": "Laoo", "my": "Mymr",
    "am": "Ethi",
}  # fmt: skip
LATIN = set(
    "af az bs ca cs cy da de en eo es et eu fi fr ga gl hr ht hu id is it jv lt lv ms mt nl no nb nn pl pt ro sk "
    "sl sq sv sw tl tr uz vi xh yo zu".split()
)
WORD = re.compile(r"\w+", re.UNICODE)


def expected_scripts(lang: str | None) -> set[str] | None:
    """The Unicode scripts (first word of a character's name: LATIN, CYRILLIC, CJK, ...) `lang` is written in;
    None where this table does not know the language."""
    if not lang:
        return None
    if "_" in lang:  # NLLB: deu_Latn, zho_Hans
        return SCRIPT_OF_CODE.get(lang.rsplit("_", 1)[1])
    code = lang.split("-")[0].lower()
    if code in NON_LATIN:
        return SCRIPT_OF_CODE[NON_LATIN[code]]
    return {"LATIN"} if code in LATIN else None


def script_of(ch: str) -> str | None:
    """The script of a letter by its Unicode name (LATIN SMALL LETTER A -> LATIN); None for other characters."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else None


def wrong_script(text: str, lang: str | None) -> bool:
    """Whether fewer than half of `text`'s letters (when it has 3 or more) are in `lang`'s script."""
    scripts = expected_scripts(lang)
    if scripts is None:
        return False
    letters = [s for s in map(script_of, text) if s is not None]
    return len(letters) >= 3 and sum(s in scripts for s in letters) < len(letters) / 2


def has_loop(text: str) -> bool:
    """Whether an n-gram of 1 to 4 words repeats back to back: 4 times for one word ("the the the the"), 3 times
    for longer ones ("is a is a is a")."""
    words = text.lower().split()
    for n in range(1, 5):
        need = 4 if n == 1 else 3
        for i in range(len(words) - n * need + 1):
            gram = words[i : i + n]
            if all(words[i + k * n : i + (k + 1) * n] == gram for k in range(1, need)):
                return True
    return False


def is_copy(source: str, output: str) -> bool:
    """Whether `output` is `source` again: 3 or more words, and their characters (lowercased, words only) at
    least 0.9 alike."""
    a, b = " ".join(WORD.findall(source.lower())), " ".join(WORD.findall(output.lower()))
    if len(a.split()) < 3 or len(b.split()) < 3:
        return False
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    # The two cheap upper bounds first: most outputs are far from their source, and ratio() is quadratic.
    return matcher.real_quick_ratio() >= 0.9 and matcher.quick_ratio() >= 0.9 and matcher.ratio() >= 0.9


def ratio_range(src_len: np.ndarray, tgt_len: np.ndarray) -> list[float] | None:
    """The 0.5th and 99.5th percentiles of target/source length over training pairs (token counts), kept with a
    run so that its translations can be flagged outside them (from every pair, or an even 1,000,000 of a larger
    corpus); None without pairs."""
    step = max(1, len(src_len) // 1_000_000)
    src_len, tgt_len = np.asarray(src_len)[::step], np.asarray(tgt_len)[::step]
    keep = (src_len > 0) & (tgt_len > 0)
    if not keep.any():
        return None
    ratios = tgt_len[keep] / src_len[keep]
    return [round(float(x), 4) for x in np.percentile(ratios, [0.5, 99.5])]


def line_flags(
    source: str,
    output: str,
    *,
    tgt_lang: str | None,
    src_tokens: int,
    out_tokens: int,
    capped: bool,
    score: float,
    ratio: list[float] | None = None,
    flag_below: float | None = None,
) -> list[str]:
    """The flags (names from FLAGS, in that order) of one translated line; an empty source or output is flagged
    only for what its numbers say (an empty line in gives an empty line out, with no flag)."""
    if not source.strip():
        return []
    flags = []
    if has_loop(output):
        flags.append("loop")
    if is_copy(source, output):
        flags.append("copy")
    if ratio is not None and src_tokens > 0 and not ratio[0] <= out_tokens / src_tokens <= ratio[1]:
        flags.append("length_ratio")
    if capped:
        flags.append("length_limit")
    if wrong_script(output, tgt_lang):
        flags.append("script")
    if flag_below is not None and score < flag_below:
        flags.append("low_score")
    return flags
