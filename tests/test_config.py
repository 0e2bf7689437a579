"""Every config group composes into the typed schema; misspelt keys and bad values fail clearly."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from mt.config import Config, ConfigError, register_configs, to_dataclass

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


@pytest.mark.parametrize("experiment", options("experiment"))
def test_every_experiment_composes(experiment):
    cfg = to_dataclass(compose_train([f"+experiment={experiment}"]))
    assert isinstance(cfg, Config)


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
