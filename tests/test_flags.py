"""Each flag of mt/decode/flags.py raised on a constructed case and not on clean output."""

import numpy as np

from mt.decode.flags import expected_scripts, has_loop, is_copy, line_flags, ratio_range, wrong_script

SRC = "A man in a blue shirt is standing on a ladder."
CLEAN = "Ein Mann in einem blauen Hemd steht auf einer Leiter."


def flags(output: str, source: str = SRC, **numbers) -> list[str]:
    settings = dict(tgt_lang="de", src_tokens=12, out_tokens=12, capped=False, score=-0.3, ratio=[0.5, 2.0])
    return line_flags(source, output, **{**settings, **numbers})


def test_clean_output_raises_no_flag():
    assert flags(CLEAN) == []
    assert flags("Sie sagte: „Nein, nein, nein.“") == []  # a word said three times is not a loop
    assert flags("", source="") == []  # an empty line in, an empty line out


def test_a_loop():
    assert has_loop("Ein Mann steht steht steht steht auf einer Leiter.")
    assert has_loop("Ein Mann auf einer Leiter auf einer Leiter auf einer Leiter")
    assert not has_loop(CLEAN)
    assert flags("Ein Mann in einem Hemd in einem Hemd in einem Hemd") == ["loop"]


def test_a_copy_of_the_source():
    assert is_copy(SRC, "a man in a blue shirt is standing on a ladder")
    assert not is_copy("Paris, 2019.", "Paris, 2019.")  # names and numbers are kept, not copied
    assert flags(SRC) == ["copy"]


def test_a_length_ratio_outside_the_training_range():
    assert flags(CLEAN, out_tokens=3) == ["length_ratio"]
    assert flags(CLEAN, out_tokens=30) == ["length_ratio"]
    assert flags(CLEAN, out_tokens=30, ratio=None) == []  # a model with no record of its training pairs


def test_the_length_limit_and_a_low_score():
    assert flags(CLEAN, capped=True) == ["length_limit"]
    assert flags(CLEAN, score=-2.5, flag_below=-1.0) == ["low_score"]
    assert flags(CLEAN, score=-0.5, flag_below=-1.0) == []


def test_another_script():
    assert wrong_script("Человек стоит на лестнице.", "de")
    assert not wrong_script("Человек стоит на лестнице.", "ru")
    assert wrong_script("Ein Mann steht.", "rus_Cyrl")  # NLLB codes name their script
    assert not wrong_script("一个男人站在梯子上。", "zh")
    assert not wrong_script("Ein Mann", "xx")  # a language this table does not know: no flag
    assert expected_scripts("ja") == {"CJK", "HIRAGANA", "KATAKANA"}
    assert flags("Человек стоит на лестнице.") == ["script"]


def test_the_ratio_range_of_training_pairs():
    src = np.array([10, 10, 10, 10, 0])
    low, high = ratio_range(src, np.array([5, 10, 12, 20, 4]))  # an empty side left out
    assert 0.5 <= low < 0.6 and 1.9 < high <= 2.0
    assert ratio_range(np.array([0]), np.array([3])) is None
