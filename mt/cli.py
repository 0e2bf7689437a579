"""What the entry points share: Hydra's own errors as one line, before Hydra runs the job.

Hydra reports a misspelt or ill-typed override, an unknown config option or a missing mandatory value in several
lines and exits with 1. `check_command_line` composes the same config first and turns such an error into one line
naming the key, with exit code 2 like every other user error here; given the entry point's checks of the values
(mt/config_checks.py), it runs them too, so that a value the code cannot use answers before torch and datasets load.
"""

from __future__ import annotations

import dataclasses
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
                raise ValueError(f"{missing[0]} is required; add {missing[0]}=... to the command")
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        print(f"error: {one_line(e)}; fix the command line (--cfg job prints every key)", file=sys.stderr)
        sys.exit(2)
    if check is not None:
        try:
            check(cfg)
        except ConfigError as e:  # the line the job itself would print (train.py's USER_ERRORS)
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
