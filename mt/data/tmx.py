"""TMX (Translation Memory eXchange, the format translation tools export their memories in) as a parallel corpus:
`data.format=tmx` reads `{data.dir}/{split}.tmx[.gz]`.

Each translation unit (`<tu>`) gives one pair when it holds a variant (`<tuv>`) in both languages, matched by
`xml:lang` (TMX 1.4; `lang` in 1.1) on the primary subtag, case aside: `en-GB`, `EN_us` and `en` are all `en`. The
text of a segment (`<seg>`) leaves out inline markup that stands for the source document's formatting codes
(`<bpt>`, `<ept>`, `<ph>`, `<it>`, `<ut>`) and keeps the text around and inside `<hi>`/`<sub>`. The file is parsed as
a stream (`xml.etree.ElementTree.iterparse`, the standard library's; no maintained TMX reader is lighter), each unit
dropped once read, so memories of millions of units read in constant memory.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from mt.data.files import open_binary
from mt.errors import DataError

XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"
CODES = {"bpt", "ept", "ph", "it", "ut"}  # inline elements whose content is the document's formatting code


def primary(lang: str | None) -> str:
    """`en-GB` -> `en`."""
    return (lang or "").replace("_", "-").split("-")[0].lower()


def segment_text(seg: ET.Element) -> str:
    """The segment's text without its formatting codes, whitespace runs as one space."""
    parts = [seg.text or ""]
    for child in seg:
        if local(child.tag) not in CODES:
            parts.append(segment_text(child))
        parts.append(child.tail or "")
    return " ".join("".join(parts).split())


def local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def tmx_path(dir: Path, split: str) -> Path:
    for name in (f"{split}.tmx", f"{split}.tmx.gz"):
        if (dir / name).is_file():
            return dir / name
    raise DataError(f"{dir / f'{split}.tmx'}[.gz]: no such file; data.format=tmx reads {{split}}.tmx in data.dir "
                    f"(files there: {', '.join(sorted(p.name for p in dir.iterdir())[:12])})")  # fmt: skip


def tmx_pairs(path: str, src: str, tgt: str, fingerprint: str) -> Iterator[dict]:
    """{"src", "tgt"} of every unit with both languages; a file with none is an error naming the languages seen."""
    del fingerprint
    want, seen, n = (primary(src), primary(tgt)), set(), 0
    try:
        with open_binary(Path(path)) as f:
            for _, elem in ET.iterparse(f, events=("end",)):
                if local(elem.tag) != "tu":
                    continue
                texts = {}
                for tuv in elem:
                    if local(tuv.tag) != "tuv":
                        continue
                    lang = primary(tuv.get(XML_LANG) or tuv.get("lang"))
                    seen.add(lang)
                    seg = next((c for c in tuv if local(c.tag) == "seg"), None)
                    if seg is not None and lang not in texts:
                        texts[lang] = segment_text(seg)
                elem.clear()
                if want[0] in texts and want[1] in texts:
                    n += 1
                    yield {"src": texts[want[0]], "tgt": texts[want[1]]}
    except ET.ParseError as e:
        raise DataError(f"{path}: not well-formed XML ({e}); is it a TMX file?") from None
    if not n:
        raise DataError(f"{path}: no translation unit holds both {src} and {tgt} (languages there: "
                        f"{', '.join(sorted(seen)) or 'none'}); set data.src_lang/data.tgt_lang")  # fmt: skip
