"""Serve translations over HTTP: `python serve.py checkpoint=RUN_DIR [port=8080 host=127.0.0.1 key=value ...]`.

The checkpoint may be a run dir, a .pt, a release (`python -m mt.export release`) or a CTranslate2 export
(`python -m mt.export ctranslate2`). API and batching: mt/server.py. Needs the `serve` extra
(pip install -e ".[serve]": FastAPI and uvicorn).
"""

import sys

from mt.cli import check_command_line

if __name__ == "__main__":  # a bad override answers before torch loads
    check_command_line("serve")

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mt import checkpoint
from mt.config import ConfigError, ServeConfig, register_configs, to_dataclass
from mt.errors import USER_ERRORS
from mt.finetune import read_parent
from mt.inference import glossary_of, run_decode_settings
from mt.model_card import run_files
from mt.runtime import pick_device, prefer_expandable_segments
from mt.translator import Translator

log = logging.getLogger("serve")
register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="serve")
def main(dcfg: DictConfig) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s", force=True)
    prefer_expandable_segments()
    try:
        try:
            import uvicorn

            from mt.server import create_app, listening_socket, test_scores
        except ImportError:
            raise ConfigError("serving needs FastAPI and uvicorn: pip install -e '.[serve]'") from None
        cfg: ServeConfig = to_dataclass(dcfg)
        ckpt = checkpoint.load(cfg.checkpoint)
        cfg.decode = run_decode_settings(cfg.decode, ckpt, list(HydraConfig.get().overrides.task))
        translator = Translator.open([ckpt], cfg.decode, pick_device(cfg.device), cfg.precision, tgt_lang=cfg.tgt_lang)
        translator.glossary = glossary_of(cfg)
        data = (ckpt.get("config") or {}).get("data", {})
        info = {"model": ckpt["path"], "engine": type(translator.model).__name__, "src_lang": data.get("src_lang"),
                "tgt_lang": data.get("tgt_lang"), "target_languages": sorted(translator.targets),
                "default_tgt_lang": cfg.tgt_lang, "glossary_terms": len(translator.glossary or ()),
                "test_scores": test_scores(ckpt), "parent": read_parent(run_files(ckpt)),
                "model_config": ckpt["model_args"]}  # fmt: skip
        app = create_app(translator, cfg, info)
        sock = listening_socket(cfg.host, cfg.port)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    port = sock.getsockname()[1]
    log.info("serving %s on http://%s:%d (the page at /, POST /translate, GET /health, GET /info)", ckpt["path"],
             cfg.host, port)  # fmt: skip
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
