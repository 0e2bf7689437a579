"""Every config group composes into the typed schema; misspelt keys and bad values fail clearly."""

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from mt.config import Config, ConfigError, register_configs
from mt.config_checks import to_dataclass

CONF = str(Path(__file__).resolve().parent.parent / "conf")
register_configs()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (Path(CONF) / group).glob("*.yaml"))


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


@pytest.mark.parametrize(
    "group,option",
    [(g, o) for g in ("data", "tokenizer", "model", "train", "decode") for o in options(g)],
)
def test_every_group_option_composes(group, option):
    overrides = [f"{group}={option}"]
    if option == "local":
        overrides += ["data.dir=/tmp", "data.src_lang=xx", "data.tgt_lang=yy"]
    if option == "bpe_separate":
        overrides += ["model.tie_embeddings=decoder"]
    cfg = to_dataclass(compose_train(overrides))
    assert isinstance(cfg, Config)
    # every value the option's file sets is what the run gets
    chosen = getattr(cfg, group)
    for key, value in yaml_values(Path(CONF) / group / f"{option}.yaml").items():
        if value != "???":
            assert getattr(chosen, key) == value, f"{group}={option}: {key}"


def yaml_values(path: Path) -> dict:
    """The keys a config file sets (without its defaults list), as plain values."""
    d = OmegaConf.to_container(OmegaConf.load(path))
    d.pop("defaults", None)
    return d


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and k != "hub_splits" else {f"{prefix}{k}": v})
    return out


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(experiment):
    budget = ["train.max_time=20"] if experiment in ("auto", "distill") else []  # planned for a budget the user gives
    budget += ["distill.teacher=runs/teacher"] if experiment == "distill" else []
    cfg = to_dataclass(compose_train([f"+experiment={experiment}", *budget]))
    assert isinstance(cfg, Config)
    raw = OmegaConf.to_container(OmegaConf.load(Path(CONF) / "experiment" / f"{experiment}.yaml"))
    # the groups it selects ("override /model: transformer_compact") are the ones the run gets...
    for entry in raw.get("defaults", []):
        ((key, option),) = entry.items()
        group = key.removeprefix("override /")
        expected = yaml_values(Path(CONF) / group / f"{option}.yaml")
        if "name" in expected:
            assert getattr(cfg, group).name == expected["name"], f"{experiment}: {group}"

    # ...and so is every value it sets (the recipe's lr, schedule, dropout, beam, ...)
    def get(path: str):
        obj = cfg
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj

    for path, value in flatten(yaml_values(Path(CONF) / "experiment" / f"{experiment}.yaml")).items():
        if isinstance(value, str):  # an interpolation ("runs/quickstart_${data.src_lang}-..."), resolved
            value = re.sub(r"\$\{([\w.]+)\}", lambda m: str(get(m.group(1))), value)
        assert get(path) == value, f"{experiment}: {path}"


def test_the_en_de_recipe_is_what_the_readme_says():
    cfg = to_dataclass(compose_train(["+experiment=multi30k_en_de"]))
    assert (cfg.model.name, cfg.model.d_model, cfg.model.norm, cfg.model.dropout) == (
        "transformer_compact",
        128,
        "pre",
        0.2,
    )
    assert (cfg.train.schedule, cfg.train.lr, cfg.train.cooldown, cfg.train.max_time) == ("constant", 2e-3, 0.2, 56)
    assert (cfg.tokenizer.vocab_size, cfg.decode.beam_size, cfg.decode.length_penalty) == (8000, 5, 1.5)


def test_translate_config_composes():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="translate", overrides=["checkpoint=x.pt", "decode.nbest=3"])
    assert cfg.decode.nbest == 3 and cfg.input == "-"


def test_misspelt_override_fails():
    with pytest.raises(ConfigCompositionException, match="max_epoch"):
        compose_train(["train.max_epoch=3"])


def test_wrong_type_fails():
    with pytest.raises((ConfigCompositionException, ValidationError, ConfigKeyError)):
        compose_train(["train.max_epochs=many"])


@pytest.mark.parametrize(
    "override,key",
    [
        ("model.norm=middle", "model.norm"),
        ("data.tgt_lang=en", "data.src_lang"),
        ("model.n_heads=7", "model.d_model"),
        ("decode.nbest=9", "decode.beam_size"),
        ("train.schedule=linear", "train.schedule=linear"),  # no max_updates/max_time to decay over
        ("train.warmup=0", "train.warmup"),
        ("train.cooldown=0.2", "train.cooldown=0.2"),  # no max_updates/max_time to anneal at the end of
        ("train.cooldown=1.5", "train.cooldown"),
        ("train.bpe_dropout=1.0", "train.bpe_dropout"),
        ("tokenizer.normalization=NFC+Upper", "tokenizer.normalization='Upper'"),
        ("tokenizer.normalization=nfc", "tokenizer.normalization='nfc'"),
    ],
)
def test_bad_values_name_their_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        to_dataclass(compose_train([override]))


def test_translate_config_checks_decode_settings():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="translate", overrides=["checkpoint=x.pt", "decode=greedy", "decode.nbest=3"])
    with pytest.raises(ConfigError, match="decode.beam_size=1, decode.nbest=3"):
        to_dataclass(cfg)


@pytest.mark.parametrize("script, first, examples", [("train.py", "train.py: train a translator", 5),
                                                     ("translate.py", "translate.py: translate text", 5),
                                                     ("serve.py", "serve.py: an HTTP server", 3)])  # fmt: skip
def test_help_opens_with_a_synopsis_and_examples_and_lists_its_own_keys(script, first, examples):
    import subprocess
    import sys

    from tests.conftest import ROOT

    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True).stdout
    head = out.split("==")[0]
    assert out.startswith(first) and head.count(f"python {script}") + head.count("torchrun") >= examples
    assert ("experiment:" in out) == (script == "train.py")  # translate.py and serve.py list no training groups


def test_train_py_on_a_local_corpus_without_a_recipe_says_which_to_use(tmp_path):
    """The library defaults are no recipe for a user's corpus (0.2-8 BLEU on a few thousand pairs): a plain
    `train.py data=local ...` stops in one line naming +experiment=auto, before anything loads."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    args = ["data=local", f"data.dir={tmp_path}", "data.src_lang=de", "data.tgt_lang=en", "train.max_time=20"]
    p = subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "add +experiment=auto" in p.stderr
    assert not list(tmp_path.iterdir()) and not (ROOT / "runs" / "local_de-en_transformer_small").exists()
