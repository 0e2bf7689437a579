"""Prepare a corpus for training, without training: `python -m mt.prepare [+experiment=NAME] [key=value ...]`.

Takes the same configuration as train.py and does what its rank 0 does before the first update: trains (or
reuses) the BPE, tokenizes the training pairs into the cache, loads the validation split. A following `train.py`
(or `torchrun ... train.py`) with the same data and tokenizer settings finds all of it in the cache and starts in
seconds, so the preparation of a WMT-size corpus can run as its own job, on one process, before the GPUs are taken.
"""

import sys

from mt.cli import CONF, check_command_line
from mt.config_checks import to_dataclass

if __name__ == "__main__":  # a bad override or value answers before torch and datasets load
    check_command_line("config", check=to_dataclass)

import logging
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mt.config import register_configs
from mt.data.corpus import prepare_data
from mt.errors import USER_ERRORS

log = logging.getLogger("prepare")
register_configs()


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def main(dcfg: DictConfig) -> None:
    start = time.time()
    try:
        cfg = to_dataclass(dcfg)
        corpus = prepare_data(cfg, Path(HydraConfig.get().runtime.output_dir), cfg.model.max_positions)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    log.info(
        "prepared in %.0f s: %d training pairs, %d validation pairs; `train.py` with the same data and tokenizer "
        "settings reuses them",
        time.time() - start,
        len(corpus.train),
        len(corpus.valid),
    )


if __name__ == "__main__":
    main()
