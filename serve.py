"""Serve translations over HTTP: `python serve.py checkpoint=RUN_DIR [port=8080 host=127.0.0.1 key=value ...]`.

The checkpoint may be a run dir, a .pt, a release (`python -m mt.export release`) or a CTranslate2 export
(`python -m mt.export ctranslate2`); several models: `checkpoint={de: RUN_A, fr: RUN_B}`. Keys and limits:
`api_keys=keys.txt requests_per_minute=60 tokens_per_minute=20000`. API, batching, keys, metrics: mt/serve/.
Needs the `serve` extra (pip install -e ".[serve]": FastAPI, uvicorn, limits, prometheus-client).
"""

import sys

from mt.cli import check_command_line
from mt.config_checks import to_dataclass

if __name__ == "__main__":  # a bad override or value answers before torch loads
    check_command_line("serve", check=to_dataclass)

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from mt.config import ConfigError, ServeConfig, register_configs
from mt.errors import USER_ERRORS
from mt.runtime import prefer_expandable_segments

log = logging.getLogger("serve")
register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="serve")
def main(dcfg: DictConfig) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s", force=True)
    prefer_expandable_segments()
    try:
        try:
            import uvicorn

            from mt.serve import Server, create_app, listening_socket, load
            from mt.serve.access import ApiKeys
        except ImportError:
            raise ConfigError("serving needs FastAPI, uvicorn, limits and prometheus-client: "
                              "pip install -e '.[serve]'") from None  # fmt: skip
        cfg: ServeConfig = to_dataclass(dcfg)
        keys = ApiKeys(cfg.api_keys) if cfg.api_keys else None
        models = load(cfg, list(HydraConfig.get().overrides.task))
        app = create_app(models, cfg, keys=keys)
        sock = listening_socket(cfg.host, cfg.port)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    port = sock.getsockname()[1]
    served = ", ".join(f"{m.name}={m.info['model']}" for m in models) if len(models) > 1 else models[0].info["model"]
    who = f"API keys from {cfg.api_keys}" if keys else "unauthenticated: anyone who can reach it may use it"
    log.info("serving %s on http://%s:%d (%s; the page at /, POST /translate, GET /health, /info, /metrics)", served,
             cfg.host, port, who)  # fmt: skip
    if keys is None and not local(cfg.host):
        log.warning("host=%s without api_keys: every machine that reaches port %d may use this server; give "
                    "api_keys=FILE (one name:key per line)", cfg.host, port)  # fmt: skip
    config = uvicorn.Config(app, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=int(cfg.request_timeout_s) + 1)  # fmt: skip
    Server(config).run(sockets=[sock])


def local(host: str) -> bool:
    """Whether `host` is this machine's loopback only."""
    return host in ("localhost", "::1") or host.startswith("127.")


if __name__ == "__main__":
    main()
