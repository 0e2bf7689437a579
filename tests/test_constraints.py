"""Lexically constrained beam search (mt/decode/constraints.py) and its glossary (mt/decode/terminology.py)."""

import logging

import pytest
import torch

from mt.config import ConfigError, DecodeConfig
from mt.data.tokenizer import EOS, PAD
from mt.decode.constraints import Constraints, constrained_beam_search, stripes
from mt.decode.ensemble import Ensemble
from mt.decode.search import beam_search
from mt.decode.terminology import Glossary
from tests.test_search import TABLE, A, B, OracleModel, padded_sources


def feed(rule: Constraints, tokens: list[int]):
    state = rule.start
    for t in tokens:
        state = rule.advance(state, t)
    return state


def test_the_state_machine_counts_phrases_met_in_any_order():
    rule = Constraints([[5, 6], [7]])
    assert rule.total == 3 and not rule.done(rule.start)
    assert rule.wanted(rule.start) == {5, 7}
    s = feed(rule, [5])
    assert rule.met(s) == 1 and rule.wanted(s) == {6, 5, 7}
    s = feed(rule, [5, 9])  # a phrase left half-way loses its progress
    assert rule.met(s) == 0
    s = feed(rule, [5, 5, 6])  # ... but a new start counts: "the the cat"
    assert rule.met(s) == 2 and rule.count_met([5, 5, 6]) == 1
    assert rule.done(feed(rule, [7, 1, 5, 6])) and rule.count_met([7, 1, 5, 6]) == 2
    assert not rule.done(feed(rule, [7, 7]))  # a phrase met twice is still one phrase


def test_ordered_phrases_count_only_in_their_order():
    rule = Constraints([[5], [7]], ordered=True)
    assert rule.wanted(rule.start) == {5}
    assert rule.count_met([7, 5]) == 1 and not rule.done(feed(rule, [7, 5]))
    assert rule.done(feed(rule, [5, 1, 7]))
    assert Constraints([[5], [7]]).done(feed(Constraints([[5], [7]]), [7, 5]))


def test_with_word_boundaries_a_phrase_is_met_only_as_whole_words():
    rule = Constraints([[5, 6]], boundary=frozenset({8, 9}))  # 8, 9: tokens that begin a word; </s> ends one too
    assert rule.count_met([5, 6, 8]) == 1 and rule.count_met([1, 5, 6]) == 1  # ... before </s>
    assert rule.count_met([5, 6, 7]) == 0 and rule.count_met([5, 6, 7, 5, 6, 9]) == 1  # "Zauns", then "Zaun und"
    state = feed(rule, [5, 6])
    assert rule.met(state) == 2 and not rule.done(state) and rule.may_end(state)
    assert rule.tokens == 2 and rule.total == 3
    assert not rule.may_end(rule.start)


def test_repeated_phrases_must_each_appear():
    rule = Constraints([[5], [5]])
    assert rule.count_met([5]) == 1 and rule.count_met([5, 3, 5]) == 2


def test_overlapping_phrases_are_each_met_where_their_words_are():
    """One rule (mt/decode/constraints.py): a phrase is met wherever its words occur, inside or overlapping another one
    too. Before: ["cat", "cat dog"] in "house cat dog" counted 2 of 2 but ["dog", "cat dog"] 1 of 2, and the search
    forced a redundant "dog" ("house house dog cat dog")."""
    house, cat, dog = 10, 11, 12  # each begins a word
    words = frozenset({house, cat, dog})
    for phrases in ([[cat], [cat, dog]], [[dog], [cat, dog]], [[cat, dog], [dog]]):
        rule = Constraints(phrases, boundary=words)
        assert rule.count_met([house, cat, dog]) == 2, phrases
        assert rule.may_end(feed(rule, [house, cat, dog])), phrases  # nothing left to force
    assert Constraints([[cat, dog], [dog, house]], boundary=words).count_met([house, cat, dog]) == 1
    ordered = Constraints([[cat, dog], [dog]], ordered=True, boundary=words)  # in order: one after the other
    assert ordered.count_met([house, cat, dog]) == 1 and ordered.count_met([cat, dog, house, dog]) == 2


def test_stripes_take_the_best_of_every_bank_in_turn():
    cands = [(-1.0, 0, 0, 10), (-2.0, 0, 0, 11), (-3.0, 1, 0, 12), (-9.0, 2, 0, 13), (-4.0, 1, 0, 14)]
    assert [c[3] for c in stripes(cands)] == [13, 12, 10, 14, 11]


def oracle(**kw):
    return DecodeConfig(use_cache=False, max_len_a=0.0, max_len_b=10, length_penalty=0.0, **kw)


def _in_order(phrases: list[list[int]], tokens: list[int], boundary: frozenset[int] | None) -> int:
    """The reference for ordered phrases: each found at its earliest place after the one before ends, whole words
    (followed by a boundary token, or the end) when `boundary` is given; how many are found in turn."""
    pos, found = 0, 0
    for phrase in phrases:
        whole = lambda end: boundary is None or end == len(tokens) or tokens[end] in boundary  # noqa: E731
        ends = (i + len(phrase) for i in range(pos, len(tokens) - len(phrase) + 1)
                if tokens[i : i + len(phrase)] == phrase and whole(i + len(phrase)))  # fmt: skip
        end = next(ends, None)
        if end is None:
            break
        pos, found = end, found + 1
    return found


def test_ordered_phrases_never_overlap_fuzzed():
    """Before: ["cat dog", "dog bird"] in order was met by "cat dog bird" (the second phrase began inside the first;
    a fuzz found 170 over-counts in 20,000 cases), against the rule that ordered phrases come one after the
    other. Fuzzed against `_in_order`, with and without word boundaries."""
    import random

    cat, dog, bird = 5, 6, 7
    assert Constraints([[cat, dog], [dog, bird]], ordered=True).count_met([cat, dog, bird]) == 1
    assert Constraints([[cat, dog], [dog, bird]], ordered=True).count_met([cat, dog, dog, bird]) == 2
    rng = random.Random(0)
    for case in range(20_000):
        boundary = frozenset({5, 6}) if case % 2 else None  # tokens 5 and 6 begin words, 7 and 8 continue them
        phrases = [[rng.randint(5, 8) for _ in range(rng.randint(1, 3))] for _ in range(rng.randint(1, 3))]
        tokens = [rng.randint(5, 8) for _ in range(rng.randint(0, 10))]
        rule = Constraints(phrases, ordered=True, boundary=boundary)
        assert rule.count_met(tokens) == _in_order(phrases, tokens, boundary), (phrases, tokens, boundary)


def run_oracle(phrases, ordered=False, **kw):
    src = torch.tensor([[7, 8, EOS]])
    rule = Constraints(phrases, ordered)
    return constrained_beam_search(OracleModel(TABLE), src, src.eq(PAD), oracle(**kw), [rule])[0]


def test_a_constraint_the_plain_search_misses_is_in_the_output():
    plain = beam_search(OracleModel(TABLE), torch.tensor([[7, 8, EOS]]), torch.zeros(1, 3, dtype=torch.bool),
                        oracle(beam_size=2))[0][0]  # fmt: skip
    assert plain.tokens == [A]
    hyps = run_oracle([[B]], beam_size=2)
    assert B in hyps[0].tokens
    assert hyps[0].tokens == [B, A]  # the best hypothesis that has B: p = 0.4 * 0.9 * 0.5


def test_without_constraints_it_is_plain_beam_search(trained_model):
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=4, nbest=2)
    plain = beam_search(trained_model, src, mask, cfg)
    none = constrained_beam_search(trained_model, src, mask, cfg, [Constraints([])] * src.size(0))
    assert [[h.tokens for h in hs] for hs in none] == [[h.tokens for h in hs] for hs in plain]


def missing_tokens(plain, n=2):
    """Per sentence, `n` tokens (4..19) its plain translation lacks: constraints the search must add."""
    out = []
    for hs in plain:
        lacking = [t for t in range(4, 20) if t not in hs[0].tokens]
        out.append([[t] for t in lacking[:n]])
    return out


@pytest.mark.parametrize("use_cache", [True, False])
def test_every_constraint_is_met_on_a_trained_model(trained_model, use_cache):
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=5, use_cache=use_cache, max_len_b=10)
    plain = beam_search(trained_model, src, mask, cfg)
    phrases = missing_tokens(plain)
    phrases[1] = [[phrases[1][0][0], phrases[1][1][0]]]  # one two-token phrase
    phrases[2] = []  # and a sentence without constraints, decoded as without them
    hyps = constrained_beam_search(trained_model, src, mask, cfg, [Constraints(p) for p in phrases])
    for p, hs in zip(phrases, hyps):
        assert Constraints(p).count_met(hs[0].tokens) == len(p)
    assert hyps[2][0].tokens == plain[2][0].tokens


def test_ordered_constraints_come_in_their_order(trained_model):
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=5, max_len_b=10)
    phrases = missing_tokens(beam_search(trained_model, src, mask, cfg))
    backwards = [list(reversed(p)) for p in phrases]
    hyps = constrained_beam_search(trained_model, src, mask, cfg, [Constraints(p, ordered=True) for p in backwards])
    for p, hs in zip(backwards, hyps):
        positions = [hs[0].tokens.index(t[0]) for t in p]
        assert positions == sorted(positions)


def test_a_line_translates_the_same_in_any_batch(trained_model):
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=4, nbest=2, max_len_b=10)
    rules = [Constraints(p) for p in missing_tokens(beam_search(trained_model, src, mask, cfg), 1)]
    batched = constrained_beam_search(trained_model, src, mask, cfg, rules)
    for i in range(src.size(0)):
        n = int((~mask[i]).sum())
        single = constrained_beam_search(trained_model, src[i : i + 1, :n], mask[i : i + 1, :n], cfg, [rules[i]])
        assert [h.tokens for h in single[0]] == [h.tokens for h in batched[i]]


def test_an_ensemble_meets_constraints_and_a_prefix_comes_first(trained_model):
    src, mask = padded_sources()
    cfg = DecodeConfig(beam_size=4, max_len_b=10)
    rules = [Constraints(p) for p in missing_tokens(beam_search(trained_model, src, mask, cfg), 1)]
    prefix = torch.full((src.size(0), 2), PAD)
    prefix[0] = torch.tensor([9, 9])
    hyps = constrained_beam_search(Ensemble([trained_model, trained_model]), src, mask, cfg, rules, prefix)
    assert all(r.count_met(hs[0].tokens) == 1 for r, hs in zip(rules, hyps))
    assert hyps[0][0].tokens[:2] == [9, 9]


def test_constraints_that_fill_the_length_limit_exactly_are_met_and_longer_ones_fall_back(trained_model):
    src, mask = padded_sources()
    src, mask = src[4:5, :2], mask[4:5, :2]  # a source of one token and </s>: limit 0 * 2 + 4 tokens with </s>
    cfg = DecodeConfig(beam_size=4, max_len_a=0.0, max_len_b=4)
    fits = Constraints([[5, 6], [7]])  # 3 tokens + </s> = the limit
    assert fits.count_met(constrained_beam_search(trained_model, src, mask, cfg, [fits])[0][0].tokens) == 2
    too_long = Constraints([[5, 6], [7, 8]])
    plain = beam_search(trained_model, src, mask, cfg)[0]
    assert [h.tokens for h in constrained_beam_search(trained_model, src, mask, cfg, [too_long])[0]] == [
        h.tokens for h in plain
    ]


def test_the_glossary_matches_whole_words_longest_first():
    g = Glossary({"leaflet": "Beipackzettel", "package leaflet": "Packungsbeilage", "tab": "Tab"})
    assert g.find("Read the package leaflet. The leaflet is short.") == ["Packungsbeilage", "Beipackzettel"]
    assert g.find("a table") == []  # not inside a word
    assert Glossary({"Tablet": "Tablette"}).find("one tablet") == []
    assert Glossary({"Tablet": "Tablette"}, ignore_case=True).find("one TABLET, two tablets") == ["Tablette"]


def test_ignoring_case_folds_terms_and_text_alike():
    """Before: re.IGNORECASE matched "İstanbul" and "sıt" but the casefold() lookup of the match raised KeyError (a
    500 in the server, a traceback in translate.py). Now both sides are folded the same way (terminology.fold):
    the Turkish capital İ folds to i, the dotless ı stays a letter of its own."""
    g = Glossary({"istanbul": "Istanbul", "sit": "Sitz", "STRASSE": "Straße"}, ignore_case=True)
    assert g.find("the dog in İstanbul") == ["Istanbul"] and g.find("ISTANBUL") == ["Istanbul"]
    assert g.find("sıt") == [] and g.find("Sit down") == ["Sitz"]
    assert g.find("die Straße") == ["Straße"]  # ß folds to ss
    merged = Glossary({"Dog": "Hund"}).merged(g)
    assert merged.ignore_case and merged.find("a DOG in istanbul") == ["Hund", "Istanbul"]
    with pytest.raises(ConfigError, match=r"g:2: 'İSTANBUL' is translated 'X' here but 'Istanbul' at g:1"):
        Glossary.from_pairs([("istanbul", "Istanbul", "g:1"), ("İSTANBUL", "X", "g:2")], ignore_case=True)


def test_an_empty_term_is_refused():
    """Before: a request's {"": "house"} matched between any two punctuation marks and inserted "house"."""
    with pytest.raises(ConfigError, match=r"glossary\[''\]: an empty source term"):
        Glossary.from_pairs([("", "house", "glossary['']")])
    with pytest.raises(ConfigError, match="an empty target term"):
        Glossary.from_pairs([("dog", " ", "glossary['dog']")])


def test_merging_a_large_glossary_is_linear():
    """Before: merged() built a set of the other glossary's keys once per term of this one (4k x 20k terms: 9.2 s,
    on the server's event loop)."""
    import time

    server = Glossary({f"term{i}": f"T{i}" for i in range(4_000)})
    request = Glossary({f"word{i}": f"W{i}" for i in range(20_000)} | {"term7": "mine"})
    start = time.perf_counter()
    merged = server.merged(request)
    assert time.perf_counter() - start < 2.0  # (before: 9 s; now the compile of one pattern, ~0.2 s)
    assert len(merged) == 24_000 and merged.find("term7 and word3 and term8") == ["mine", "W3", "T8"]


def test_a_glossary_stacked_on_another_finds_what_their_merge_finds():
    """A request's glossary over the server's is matched on its own (`Stacked`, so that a one-term request does not
    recompile a 20,000-term server glossary): the terms found are those of the one merged pattern, longest first
    where terms overlap, the top one's target where both have a term; fuzzed over random terms and lines."""
    import random

    from mt.decode.terminology import Stacked

    rng = random.Random(0)
    words = ["a", "b", "c", "ab", "d"]
    phrase = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
    for case in range(2_000):
        ignore_case = case % 2 == 1
        base = Glossary({phrase(rng.randint(1, 3)): f"S{i}" for i in range(rng.randint(1, 6))}, ignore_case)
        top = Glossary({phrase(rng.randint(1, 3)): f"R{i}" for i in range(rng.randint(1, 4))}, ignore_case)
        stacked = base.merged(top)
        merged = Glossary({**base.terms, **top.terms}, ignore_case)
        line = phrase(rng.randint(1, 8))
        line = line.upper() if ignore_case and case % 4 == 1 else line
        assert isinstance(stacked, Stacked) and stacked.find(line) == merged.find(line), (base.terms, top.terms)
        assert len(stacked) == len(merged)


def test_a_glossary_file_with_two_translations_of_a_term_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "g.tsv"
    path.write_text("# medical\ntablet\tTablette\n\ntablet\tPille\n")
    with pytest.raises(ConfigError, match=r"g.tsv:4: 'tablet' is translated 'Pille' here but 'Tablette' at .*g.tsv:2"):
        Glossary.from_file(path)


def test_the_translator_meets_constraints_and_glossary_terms(toy_run, caplog):
    from mt.decode.translator import Translator

    t = Translator.load(toy_run, beam_size=4)
    lines = ["the cat sees", "a dog", ""]
    plain = t.translate(lines)
    word = next(w for w in ("house", "tree", "red", "big", "small") if w not in " ".join(plain).split())
    out = t.translate(lines, constraints=[[word], [], []])
    assert word in out[0].split() and out[1] == plain[1] and out[2] == ""
    g = t.translate(lines, glossary={"dog": word})
    assert word in g[1].split() and g[0] == plain[0]
    with pytest.raises(ConfigError, match="constraints need decode.beam_size >= 2"):
        t.translate(lines, constraints=[["a"], [], []], beam_size=1)
    with pytest.raises(ConfigError, match="not sampling"):
        t.translate(lines, constraints=[["a"], [], []], sampling=True)
    with caplog.at_level(logging.WARNING, logger="mt.decode.terminology"):
        t.translate(["a"], constraints=[["the cat " * 40]])  # cannot fit: warned, translated plainly
    assert "line 1: 1 of 1 constraints not met" in caplog.text
