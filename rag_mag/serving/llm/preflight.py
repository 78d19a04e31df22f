"""Fast pre-flight checks: does an OpenAI-compatible server answer, and does it serve the models a pipeline names."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from rag_mag.errors import ConfigError, ServerNotRunningError
from rag_mag.serving.llm.records import api_key_path, export_api_key
from rag_mag.serving.llm.settings import (
    API_KEY_ENV,
    START_HINT,
    URL_ENV,
    default_api_base_url,
    normalize_api_base_url,
    start_hint,
)


def check_server(api_base_url: str | None = None, *, model: str | None = None, timeout: float = 3.0,
                 api_key: str | None = None) -> list[str]:
    """Fail fast if no OpenAI-compatible server answers at ``api_base_url``; return the served model names.

    Raises ``ServerNotRunningError`` (down, starting, or not answering within ``timeout`` seconds) or
    ``ConfigError`` (it answers, but does not serve ``model``, or needs an API key). Without ``api_key``, the key of
    the servers rag-mag starts is sent, and put in ``$VLLM_API_KEY`` for this process's generators (``records``).
    """
    import httpx

    url = normalize_api_base_url(api_base_url or default_api_base_url())
    api_key = api_key or export_api_key()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/models", headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        raise ServerNotRunningError(
            f"the vLLM server at {url} did not answer within {timeout:g} s (is it still starting? "
            f"see `rag-mag serve-llm --status`); if it is not running, {START_HINT}"
        ) from None
    except httpx.TransportError as error:
        raise ServerNotRunningError(
            f"no vLLM server at {url} ({type(error).__name__}: {error}); {start_hint(url)}"
            f", or point api_base_url / {URL_ENV} at a running server"
        ) from None
    if response.status_code == 401:
        raise ConfigError(f"the vLLM server at {url} wants an API key {'other than the one sent' if api_key else ''}"
                          f"; a server rag-mag started takes the key in {api_key_path()}, another one its --api-key: "
                          f"set {API_KEY_ENV} to it")
    if response.status_code != 200:
        raise ServerNotRunningError(
            f"the server at {url} answered GET /models with HTTP {response.status_code}; it is not a ready "
            f"vLLM server. {START_HINT[0].upper()}{START_HINT[1:]} or check its log"
        )
    try:
        served = [entry["id"] for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise ServerNotRunningError(
            f"the server at {url} is not an OpenAI-compatible server (GET /models returned {response.text[:200]!r})"
        ) from None
    if model is not None:
        check_server_models(served, model, url)
    return served


def iter_vllm_generators(pipeline: Any) -> Iterator[tuple[str, Any]]:
    """Every VLLMChatGenerator in a Haystack pipeline, also inside SuperComponents and fallback/LLM wrappers."""
    from haystack_integrations.components.generators.vllm import VLLMChatGenerator

    def visit(name: str, instance: Any) -> Iterator[tuple[str, Any]]:
        if isinstance(instance, VLLMChatGenerator):
            yield name, instance
            return
        inner_pipeline = getattr(instance, "pipeline", None)
        if inner_pipeline is not None and hasattr(inner_pipeline, "walk"):
            for inner_name, inner in inner_pipeline.walk():
                yield from visit(f"{name}.{inner_name}", inner)
        for attribute in ("chat_generator", "generator"):
            if (inner := getattr(instance, attribute, None)) is not None:
                yield from visit(f"{name}.{attribute}", inner)
        for index, inner in enumerate(getattr(instance, "chat_generators", None) or ()):
            yield from visit(f"{name}.chat_generators[{index}]", inner)

    for component_name, component_instance in pipeline.walk():
        yield from visit(component_name, component_instance)


def check_generators(generators: Iterable[tuple[str, str, str | None, str | None]], *,
                     timeout: float = 3.0) -> dict[str, list[str]]:
    """The pre-flight: check the server of each ``(component name, api_base_url, model, api_key)`` (each URL
    once) and that it serves the model (when one is named).

    Returns ``{api_base_url: served model names}``; raises like :func:`check_server`, naming the component.
    """
    checked: dict[str, list[str]] = {}
    for name, api_base_url, model, api_key in generators:
        url = normalize_api_base_url(api_base_url)
        try:
            if url not in checked:
                checked[url] = check_server(url, timeout=timeout, api_key=api_key)
            if model:
                check_server_models(checked[url], model, url)
        except (ServerNotRunningError, ConfigError) as error:
            raise type(error)(f"pipeline component {name!r}: {error}") from None
    return checked


def check_pipeline_servers(pipeline: Any, *, timeout: float = 3.0) -> dict[str, list[str]]:
    """The pre-flight of a built pipeline: every VLLMChatGenerator in it (see :func:`check_generators`)."""
    return check_generators(((name, generator.api_base_url, generator.model,
                              generator.api_key.resolve_value() if generator.api_key is not None else None)
                             for name, generator in iter_vllm_generators(pipeline)), timeout=timeout)


def check_server_models(served: list[str], model: str, url: str) -> None:
    if model not in served:
        raise ConfigError(
            f"the vLLM server at {url} serves {served}, not {model!r}; set the generator's model to one of "
            f"those, or restart the server with `rag-mag serve-llm --stop` then `rag-mag serve-llm --model ...`"
        )
