"""What the entry points share: Hydra's own errors as one line, before Hydra runs the job.

Hydra reports a misspelt or ill-typed override, an unknown config option or a missing mandatory value in several
lines and exits with 1. `check_command_line` composes the same config first and turns such an error into one line
naming the key, with exit code 2 like every other user error here; given the entry point's checks of the values
(mt/config_checks.py), it runs them too, so that a value the code cannot use answers before torch and datasets load.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mt.config import Config, ConfigError, ServeConfig, TranslateConfig, register_configs

CONF = Path(__file__).resolve().parent.parent / "conf"


def one_line(e: BaseException) -> str:
    """The first line of an exception and of each cause under it, joined: Hydra puts the key in the first and
    the reason (e.g. "Key 'max_epoch' not in 'TrainConfig'") in its cause."""
    parts = []
    while e is not None and len(parts) < 3:
        line = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__
        if line not in parts:
            parts.append(line)
        e = e.__cause__ or e.__context__
    return ": ".join(parts)


TYPES = {"Float": "a number", "Integer": "a whole number", "Boolean": "true or false"}


def _close(word: str, options) -> str:
    """ "; did you mean X?" for the option nearest `word`, or ""."""
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {near[0]}?" if near else ""


def _fields(schema, dotted: str) -> list[str]:
    """The keys of the section `dotted` ("train", "decode") of a schema dataclass."""
    cls = schema
    for part in dotted.split(".") if dotted else []:
        hints = {f.name: f.type for f in dataclasses.fields(cls)}
        cls = getattr(sys.modules[cls.__module__], str(hints.get(part, "")).split(" ")[0], None)
        if cls is None or not dataclasses.is_dataclass(cls):
            return []
    return [f.name for f in dataclasses.fields(cls)]


def explain(e: BaseException, args: list[str], config_name: str) -> str:
    """Hydra's and OmegaConf's errors about a command line, said as what to type: an option group given without
    its +, an unknown option with the known ones, a misspelt key with the nearest one, a value of the wrong type
    with the key and the type expected. Anything else: its own first lines (`one_line`)."""
    text = one_line(e)
    given = {a.split("=", 1)[0].lstrip("+~"): a for a in args if "=" in a}
    schema = {"config": Config, "translate": TranslateConfig, "serve": ServeConfig}[config_name]
    if m := re.search(r"Could not override '(\w+)'\. No match in the defaults list", text):
        group = m.group(1)
        arg = given.get(group, f"{group}=...")
        return f"{arg}: {group} is not in the default config; add it with a +: +{arg.lstrip('+')}"
    if m := re.search(r"Could not find '(\w+)/([^']+)'", text):
        group, name = m.groups()
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        arg = given.get(group, f"{group}={name}")
        return f"{arg}: no {group} named {name!r}{_close(name, options)} (the {group} options: {', '.join(options)})"
    if m := re.search(r"Error merging override ([\w.]+)=(.*?): Value '.*?' of type '\w+' could not be converted "
                      r"to (\w+)", text):  # fmt: skip
        key, value, kind = m.groups()
        return f"{key}={value}: {value!r} is not {TYPES.get(kind, kind.lower())}, which {key} takes"
    if m := re.search(r"Error merging override ([\w.]+)=(.*?): Value '.*?' is not a valid bool", text):
        key, value = m.groups()
        return f"{key}={value}: {value!r} is not true or false, which {key} takes"
    if m := re.search(r"Error merging override ([\w.]+)=(.*?): (.*?)(: Value '\$VALUE|$)", text):
        key, value, why = m.group(1), m.group(2), m.group(3)  # another type error, without the placeholders
        return f"{key}={value}: {why}"
    if m := re.search(r"Could not override '([\w.]+)': Key '(\w+)' not in '(\w+)'", text):
        dotted, key = m.group(1), m.group(2)
        section = dotted.rsplit(".", 1)[0] if "." in dotted else ""
        options = [f"{section}.{f}" if section else f for f in _fields(schema, section)]
        arg = given.get(dotted, dotted)
        return f"{arg}: {section or 'the config'} has no key {key!r}{_close(dotted, options)}"
    if m := re.search(r"unknown key '(\w+)'", text):
        options = [f.name for f in dataclasses.fields(schema)]
        return f"+{m.group(1)}: no such section{_close(m.group(1), options)} (the sections: {', '.join(options)})"
    if m := re.search(r"([\w.+]+)=(~[^:]*): token recognition error at: '~'", text):
        key, value = m.groups()
        return (f"{key}={value}: ~ is not expanded here; write $HOME{value[1:]} (the shell expands it) or the full "
                "path")  # fmt: skip
    if m := re.search(r"Missing mandatory value: ([\w.]+)", text):
        return required(m.group(1))
    return f"{text}; fix the command line (--cfg job prints every key)"


def required(key: str) -> str:
    """What to say of a key the command must give (`???`): a local corpus's languages above all, which have no
    default (a run with Multi30k's en/de on a German->English corpus would train the wrong direction)."""
    if key in ("data.src_lang", "data.tgt_lang"):
        side = "source" if key == "data.src_lang" else "target"
        return (f"{key} is required: the language of the corpus's {side} files, as in their names (train.de -> de); "
                "add data.src_lang=.. data.tgt_lang=.. to the command")  # fmt: skip
    return f"{key} is required; add {key}=... to the command"


def without_recipe(args: list[str]) -> str | None:
    """What to say to `train.py data=local ...` with no recipe: neither an experiment nor a model chosen, nor a
    parent to fine-tune. The library's defaults (transformer_small, the paper's schedule for 100 epochs) are a
    starting point for a config written by hand, not a recipe for a user's corpus: on corpora of a few thousand
    pairs they scored 0.2 to 8 BLEU (docs/results.md), where `+experiment=auto` chooses for the corpus and budget."""
    names = {a.split("=", 1)[0] for a in args}
    if "data=local" not in args or names & {"+experiment", "model", "train.init_from"}:
        return None
    return ("train.py data=local without a recipe: the defaults score 0.2-8 BLEU on a corpus of a few thousand "
            "pairs; add +experiment=auto train.max_time=MINUTES (chosen for this corpus and budget), or choose one "
            "yourself with model=... (python train.py --help lists the options)")  # fmt: skip


def check_command_line(
    config_name: str, argv: list[str] | None = None, check: Callable[[DictConfig], object] | None = None
) -> None:
    """Compose `config_name` with the command line's overrides, then run `check` on it (the entry point's
    `to_dataclass`); on an error print one line and exit 2. Flags (`--help`, `--cfg job`, `-m`) are left to Hydra."""
    args = sys.argv[1:] if argv is None else argv
    if any(a.startswith("-") for a in args):
        return
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name, overrides=args)
            schema = {"config": Config, "translate": TranslateConfig, "serve": ServeConfig}[config_name]
            unknown = sorted(set(cfg.keys()) - {f.name for f in dataclasses.fields(schema)})
            if unknown:
                raise ValueError(f"unknown key {unknown[0]!r} (added with +); the keys are {', '.join(cfg.keys())}")
            missing = sorted(OmegaConf.missing_keys(cfg))
            if missing:
                raise ValueError(required(missing[0]))
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        print(f"error: {explain(e, args, config_name)}", file=sys.stderr)
        sys.exit(2)
    if config_name == "config" and (why := without_recipe(args)):
        print(f"error: {why}", file=sys.stderr)
        sys.exit(2)
    if check is not None:
        try:
            check(cfg)
        except ConfigError as e:  # the line the job itself would print (train.py's USER_ERRORS)
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
