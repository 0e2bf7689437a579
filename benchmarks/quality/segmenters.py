"""Which sentence segmenter for `split=sentences`? Candidates from PyPI that need no download at run time, on a
boundary test written for the cases that break splitters (abbreviations, numbers, ordinals, ellipses, quotes,
brackets, initials) in English, German and French, and on speed.

    pip install sentencex pysbd sentence-splitter
    python benchmarks/quality/segmenters.py [--repeat 200]

Each case is a paragraph given as its sentences; the paragraph is their join with one space, and a segmenter
gets it right when it returns exactly those sentences. Prints, per candidate and language, the cases right and the
boundary precision/recall, then sentences/s over all paragraphs (`--repeat` times), in one run.
"""

from __future__ import annotations

import argparse
import time

CASES = {
    "en": [
        ["Dr. Smith arrived at 3.30 p.m. on Monday.", "He was late."],
        ["The price rose by 3.5 percent.", "Analysts were surprised."],
        ["Mr. and Mrs. Brown live in the U.S.", "They moved there in 1999."],
        ['She said: "I will come tomorrow."', "Nobody believed her."],
        ["Wait...", "Is that really true?"],
        ["It was a long day... but a good one."],
        ["The meeting (see p. 5) starts at noon.", "Please be on time."],
        ["J. R. R. Tolkien wrote many books.", "The Hobbit is one of them."],
        ["What a surprise!", "Where did you find it?", "On the beach."],
        ["Prices start at $4.99 per item, e.g. for apples.", "Oranges cost more."],
        ["The company, Acme Inc., was founded in 1990.", "It makes tools."],
        ["Visit www.example.com for details.", "Registration closes on Friday."],
        ["A man in an orange hat stares at something.", "A dog runs on the beach.", "Two men talk."],
        ["Section 2.1 describes the method, i.e. the algorithm we use.", "Section 3 gives results."],
        ["He scored 98 vs. 87 in the final round.", "The crowd cheered."],
    ],
    "de": [
        ["Dr. Müller kam um 15 Uhr an.", "Er war zu spät."],
        ["Der Preis stieg um 3,5 Prozent.", "Das überraschte viele."],
        ["Am 1. Mai ist ein Feiertag.", "Die Geschäfte sind geschlossen."],
        ["Es gibt viele Obstsorten, z. B. Äpfel und Birnen.", "Birnen sind süß."],
        ["Wir brauchen Mehl, Zucker, Eier usw. für den Kuchen.", "Dann backen wir."],
        ["Er sagte: „Ich komme morgen.“", "Niemand glaubte ihm."],
        ["Warte...", "Ist das wirklich wahr?"],
        ["Die Sitzung (s. S. 5) beginnt um zwölf.", "Bitte seien Sie pünktlich."],
        ["Das war am 2. Juli 2020 in Berlin.", "Es regnete."],
        ["Die Firma, die Muster GmbH, wurde 1990 gegründet.", "Sie stellt Werkzeuge her."],
        ["Was für eine Überraschung!", "Wo hast du das gefunden?", "Am Strand."],
        ["Ein Mann mit einem orangefarbenen Hut starrt auf etwas.", "Ein Hund rennt am Strand."],
        ["Das Gesetz gilt ab dem 3. Oktober d. J. für alle Bürger.", "Ausnahmen sind selten."],
        ["Herr Prof. Dr. Schmidt hält heute die Vorlesung.", "Sie beginnt um 10 Uhr."],
        ["Nehmen Sie 2 Tabletten tgl. nach dem Essen ein.", "Trinken Sie dazu Wasser."],
    ],
    "fr": [
        ["M. Dupont est arrivé à 15 h.", "Il était en retard."],
        ["Le prix a augmenté de 3,5 pour cent.", "Les analystes étaient surpris."],
        ["Mme Martin habite à Paris.", "Elle y travaille depuis 1999."],
        ["Il a dit : « Je viendrai demain. »", "Personne ne l'a cru."],
        ["Attendez...", "Est-ce vraiment vrai ?"],
        ["La réunion (voir p. 5) commence à midi.", "Soyez à l'heure, s.v.p."],
        ["Quelle surprise !", "Où l'avez-vous trouvé ?", "Sur la plage."],
        ["Il y a beaucoup de fruits, p. ex. des pommes.", "Les poires sont sucrées."],
        ["C'était le 1er mai 2020 à Lyon.", "Il pleuvait."],
        ["La société, Exemple S.A., a été fondée en 1990.", "Elle fabrique des outils."],
        ["Un homme avec un chapeau orange regarde quelque chose.", "Un chien court sur la plage."],
        ["Le Dr Bernard consulte le lundi, etc. et le mardi.", "Prenez rendez-vous."],
        ["Prenez 2 comprimés par jour, c.-à-d. matin et soir.", "Buvez de l'eau."],
        ["Voir l'art. 3 du règlement.", "Il s'applique à tous."],
        ["Le XIXe s. fut une période de changements.", "L'industrie se développa."],
    ],
}


def candidates() -> dict:
    """{name: (language -> list of sentences)} for the segmenters that are installed."""
    out = {}
    try:
        from sentencex import segment

        out["sentencex"] = lambda lang, text: list(segment(lang, text))
    except ImportError:
        pass
    try:
        import pysbd

        segmenters = {}

        def pysbd_split(lang, text):
            seg = segmenters.setdefault(lang, pysbd.Segmenter(language=lang, clean=False))
            return seg.segment(text)

        out["pysbd"] = pysbd_split
    except ImportError:
        pass
    try:
        from sentence_splitter import SentenceSplitter

        splitters = {}
        out["sentence-splitter"] = lambda lang, text: splitters.setdefault(lang, SentenceSplitter(language=lang)).split(
            text
        )
    except ImportError:
        pass
    return out


def boundaries(sentences: list[str]) -> set[int]:
    """Character offsets (in the one-space join) where a sentence ends."""
    out, at = set(), 0
    for s in sentences[:-1]:
        at += len(s.strip()) + 1
        out.add(at)
    return out


def score(split, lang: str) -> tuple[int, int, float, float]:
    right, tp, fp, fn = 0, 0, 0, 0
    for case in CASES[lang]:
        got = [s.strip() for s in split(lang, " ".join(case)) if s.strip()]
        right += got == case
        want, have = boundaries(case), boundaries(got)
        tp, fp, fn = tp + len(want & have), fp + len(have - want), fn + len(want - have)
    return right, len(CASES[lang]), tp / max(tp + fp, 1), tp / max(tp + fn, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    found = candidates()
    if not found:
        raise SystemExit("no candidate installed: pip install sentencex pysbd sentence-splitter")
    print(f"{'segmenter':<18}{'lang':<6}{'cases right':>12}{'precision':>11}{'recall':>8}")
    for name, split in found.items():
        for lang in CASES:
            right, n, p, r = score(split, lang)
            print(f"{name:<18}{lang:<6}{f'{right}/{n}':>12}{p:>11.2f}{r:>8.2f}")
    sentences = sum(len(c) for cases in CASES.values() for c in cases) * args.repeat
    for name, split in found.items():
        start = time.perf_counter()
        for _ in range(args.repeat):
            for lang, cases in CASES.items():
                for case in cases:
                    split(lang, " ".join(case))
        print(f"{name:<18} {sentences / (time.perf_counter() - start):,.0f} sentences/s")


if __name__ == "__main__":
    main()
