"""Whether the Hugging Face Hub can be reached, found once a process in at most a few seconds. Without it,
`datasets` and `huggingface_hub` retry each request for ~30 s and print a warning a retry; this project says it
in one line instead and reads their caches only, as `HF_HUB_OFFLINE=1` (which skips the check) makes them do."""

from __future__ import annotations

import functools
import logging
import os
import socket
from urllib.parse import urlparse

log = logging.getLogger(__name__)

TIMEOUT = 3.0  # seconds for one TCP connection to the Hub's host
PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")  # a proxy may reach what a direct connection cannot


def offline_set() -> bool:
    """Whether the user asked for offline mode (HF_HUB_OFFLINE=1)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def unreachable() -> str | None:
    """Why the Hub cannot be reached ("huggingface.co: Name or service not known"), or None where it can, where
    offline mode is already set, or where a proxy is configured (not checked)."""
    if offline_set() or any(os.environ.get(p) for p in PROXIES):
        return None
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=TIMEOUT).close()
    except OSError as e:
        return f"{host}: {e.strerror or type(e).__name__}"
    return None


@functools.cache
def go_offline(what: str) -> bool:
    """Put `datasets` and `huggingface_hub` in offline mode (their caches only) when the Hub cannot be reached,
    saying so once; returns whether they are offline (by this or by HF_HUB_OFFLINE=1)."""
    why = unreachable()
    if why is None:
        return offline_set()
    log.warning("the Hugging Face Hub cannot be reached (%s): %s from the local cache only (HF_HUB_OFFLINE=1 skips "
                "this check)", why, what)  # fmt: skip
    os.environ["HF_HUB_OFFLINE"] = "1"
    import huggingface_hub.constants

    huggingface_hub.constants.HF_HUB_OFFLINE = True
    try:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
    except ImportError:
        pass
    return True
