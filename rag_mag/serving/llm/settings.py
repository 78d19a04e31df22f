"""Where the vLLM server is reached and run from: its names, ports, base URLs and environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rag_mag.errors import ConfigError
from rag_mag.models import REPO_ROOT, artifacts_dir

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_API_BASE_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}/v1"
# The name under which the default model, the trained reader, is served: the `model:` of every
# VLLMChatGenerator in pipelines/. The untrained SmolLM2 stays available as the base reader.
DEFAULT_SERVED_MODEL_NAME = "smollm2-135m-reader"
BASE_SERVED_MODEL_NAME = "smollm2-135m-instruct"
WRITER_SERVED_MODEL_NAME = "smollm2-135m-writer"  # the question writer of `rag-mag synth`
URL_ENV = "RAG_MAG_VLLM_URL"
API_KEY_ENV = "VLLM_API_KEY"  # read by vLLM (the key it asks for) and by VLLMChatGenerator (the key it sends)
PYTHON_ENV = "RAG_MAG_VLLM_PYTHON"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
START_HINT = "start it with `rag-mag serve-llm`"


def start_hint(url: str) -> str:
    """How to start a server at ``url``: the port goes inside the command."""
    if url == DEFAULT_API_BASE_URL:
        return START_HINT
    return f"start it with `rag-mag serve-llm --port {parse_api_base_url(url).port}`"


def default_api_base_url() -> str:
    """Base URL of the generation server: ``$RAG_MAG_VLLM_URL`` or ``http://127.0.0.1:8000/v1``."""
    return normalize_api_base_url(os.environ.get(URL_ENV) or DEFAULT_API_BASE_URL)


def vllm_python() -> Path:
    """Python of the vLLM environment: ``$RAG_MAG_VLLM_PYTHON`` or ``<repo>/.venv-vllm/bin/python``."""
    return Path(os.environ.get(PYTHON_ENV) or REPO_ROOT / ".venv-vllm" / "bin" / "python")


def state_dir() -> Path:
    """Folder of the pid and log files of detached servers."""
    return artifacts_dir() / "vllm"


@dataclass(frozen=True)
class ApiBaseUrl:
    """An OpenAI-compatible base URL taken apart, e.g. ``http://127.0.0.1:8000/v1``."""

    scheme: str
    host: str
    port: int
    path: str  # "/v1", without a trailing slash

    @property
    def root(self) -> str:
        """The server root, where vLLM answers ``/health``."""
        return f"{self.scheme}://{_host_for_url(self.host)}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}{self.path}"


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_api_base_url(url: str) -> ApiBaseUrl:
    """Split a base URL; the port defaults to 80/443 and the path to ``/v1``."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"invalid vLLM api_base_url {url!r}: expected http(s)://HOST[:PORT][/v1], "
            f"e.g. {DEFAULT_API_BASE_URL}"
        )
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ConfigError(f"invalid port in vLLM api_base_url {url!r}: expected a number from 1 to 65535") from None
    path = parts.path.rstrip("/") or "/v1"
    return ApiBaseUrl(scheme=parts.scheme, host=parts.hostname, port=port, path=path)


def normalize_api_base_url(url: str) -> str:
    return parse_api_base_url(url).url


def api_base_url_for(host: str, port: int) -> str:
    return f"http://{_host_for_url(host)}:{port}/v1"
