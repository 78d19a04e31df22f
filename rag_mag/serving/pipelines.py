"""Load, configure and run the YAML pipelines of ``pipelines/``.

* ``load_pipeline(path, overrides)`` reads a pipeline YAML, applies ``name.param=value`` overrides to
  the components' init parameters *before* anything is constructed, and builds it with Haystack's
  safe loader (only classes from ``rag_mag``, ``haystack`` and ``haystack_integrations``). It refuses
  to run while Haystack's environment overrides would widen that list (``check_allowlist_env``).
* ``run_pipeline(pipeline, inputs)`` checks every vLLM server the pipeline uses (fast, clear error
  when one is down), runs it, and unwraps errors a user caused.

A pipeline's ``metadata.rag_mag`` section (optional) declares short names used by the CLI:
``inputs.question`` (sockets that receive the question), ``outputs`` (where the answers are) and
``parameters`` (aliases for ``--set``: ``index=DIR`` sets ``retriever.document_store.path``).
Overrides nest through objects that have ``type`` and ``init_parameters``
(``retriever.document_store.path=DIR``). ``RAG_MAG_VLLM_URL``, when set, replaces the
``api_base_url`` of every VLLMChatGenerator (an explicit override still wins).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import logging
import os
from pathlib import Path
from typing import Any

import yaml

from rag_mag.errors import ConfigError, RagMagError, ServerNotRunningError
from rag_mag.models import REPO_ROOT, artifacts_dir

logger = logging.getLogger(__name__)

ALLOWED_MODULES = ["rag_mag", "haystack", "haystack_integrations"]
PIPELINES_DIR = REPO_ROOT / "pipelines"
VLLM_GENERATOR_TYPE = "haystack_integrations.components.generators.vllm.chat.chat_generator.VLLMChatGenerator"
VLLM_DEFAULT_URL = "http://localhost:8000/v1"  # VLLMChatGenerator's api_base_url when a pipeline names none
URL_ENV = "RAG_MAG_VLLM_URL"
UNSAFE_ENV = "HAYSTACK_UNSAFE_DESERIALIZATION"
ALLOWLIST_ENV = "HAYSTACK_DESERIALIZATION_ALLOWLIST"
CONTEXT_TOO_LONG = ("context length", "maximum model length", "max_model_len", "too long", "longer than")


def default_index_dir() -> Path:
    """The index that `rag-mag index` writes and `rag-mag ask` reads by default."""
    return artifacts_dir() / "index-default"


def default_qdrant_dir() -> Path:
    """The embedded Qdrant folder that pipelines/rag_qdrant.yaml reads by default (`rag-mag export-index`)."""
    return artifacts_dir() / "qdrant-default"


def default_pipeline(name: str) -> Path:
    """``pipelines/<name>.yaml`` of this checkout."""
    return PIPELINES_DIR / f"{name}.yaml"


# ---------------------------------------------------------------------------------------- overrides
def parse_override(text: str) -> tuple[str, Any]:
    """``"name.param=value"`` -> ``("name.param", value)``; the value is parsed as YAML (``3`` is an int,
    ``true`` a bool, ``null`` None, ``[a, b]`` a list, anything else a string)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"bad override {text!r}: expected name.param=value (e.g. retriever.top_k=3) or "
                          "alias=value (e.g. index=artifacts/index-default)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        raise ConfigError(f"bad value in override {text!r}: {error}") from None
    return key, value


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    return dict(parse_override(item) for item in items or [])


def _class_of(type_name: Any, where: str) -> type:
    """Import the class named by a ``type`` field, but only from an allowed module."""
    if not isinstance(type_name, str) or "." not in type_name:
        raise ConfigError(f"{where}: 'type' must be a dotted class path, got {type_name!r}")
    module_name, class_name = type_name.rsplit(".", 1)
    if not any(module_name == allowed or module_name.startswith(allowed + ".") for allowed in ALLOWED_MODULES):
        raise ConfigError(f"{where}: module {module_name!r} is not allowed; pipelines may only use classes from "
                          f"{', '.join(ALLOWED_MODULES)}")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"{where}: cannot import {type_name!r} ({error}); check the type name and that its "
                          "package is installed") from None


def _set_param(node: dict[str, Any], path: list[str], value: Any, where: str) -> None:
    """Set ``path`` inside a ``{type, init_parameters}`` node, descending into nested typed objects."""
    cls = _class_of(node.get("type"), where)
    params = node.setdefault("init_parameters", {})
    if params is None:
        params = node["init_parameters"] = {}
    name = path[0]
    signature = inspect.signature(cls.__init__).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.values())
    valid = [p for p in signature if p not in ("self", "args", "kwargs")]
    if name not in signature and not accepts_any:
        raise ConfigError(f"{where}: {cls.__name__} has no parameter {name!r}; valid parameters are: "
                          f"{', '.join(valid)}")
    if len(path) == 1:
        params[name] = value
        return
    child = params.get(name)
    if isinstance(child, dict) and "type" in child:
        _set_param(child, path[1:], value, f"{where}.{name}")
    elif isinstance(child, dict) and len(path) == 2:  # a plain mapping, e.g. llm.generation_kwargs.max_tokens
        child[path[1]] = value
    else:
        raise ConfigError(f"{where}: parameter {name!r} is not an object with parameters, so "
                          f"{'.'.join(path)} cannot be set; set {name} itself")


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of a pipeline dict with overrides applied (aliases expanded); raises ConfigError on unknown names."""
    data = copy.deepcopy(data)
    components = data.get("components") or {}
    aliases = ((data.get("metadata") or {}).get("rag_mag") or {}).get("parameters") or {}
    expanded: list[tuple[str, str, Any]] = []
    for key, value in overrides.items():
        if "." not in key:
            if key not in aliases:
                known = ", ".join(sorted(aliases)) or "none"
                raise ConfigError(f"unknown override {key!r}: use name.param=value, or one of this pipeline's "
                                  f"short names ({known})")
            targets = aliases[key] if isinstance(aliases[key], list) else [aliases[key]]
            expanded += [(str(target), f"{key} ({target})", value) for target in targets]
        else:
            expanded.append((key, key, value))
    for target, label, value in expanded:
        name, *path = target.split(".")
        if name not in components:
            raise ConfigError(f"override {label}: no component {name!r} in this pipeline; its components are: "
                              f"{', '.join(components)}")
        if not path:
            raise ConfigError(f"override {label}: name a parameter, e.g. {name}.param=value")
        _set_param(components[name], path, value, f"component {name!r}")
    return data


# ---------------------------------------------------------------------------------------- loading
def read_pipeline_dict(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a pipeline YAML file; missing file and malformed YAML give a ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        shipped = ", ".join(sorted(p.name for p in PIPELINES_DIR.glob("*.yaml")))
        raise ConfigError(f"pipeline file {path} does not exist; give the path of a YAML pipeline "
                          f"(shipped in {PIPELINES_DIR}: {shipped})")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {error}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read pipeline file {path}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("components"), dict):
        raise ConfigError(f"{path} is not a Haystack pipeline: expected a mapping with a 'components' section")
    return data


def _apply_url_env(data: dict[str, Any]) -> None:
    url = os.environ.get(URL_ENV)
    if not url:
        return
    for component in data["components"].values():
        if isinstance(component, dict) and component.get("type") == VLLM_GENERATOR_TYPE:
            (component.setdefault("init_parameters", {}) or {})["api_base_url"] = url


def check_allowlist_env() -> None:
    """Refuse to build pipelines while Haystack's environment settings would load classes from modules
    other than ``ALLOWED_MODULES`` (they apply to every load in the process, ours included)."""
    if os.environ.get(UNSAFE_ENV, "").strip().lower() in ("1", "true"):
        raise ConfigError(f"{UNSAFE_ENV} is set: it turns off Haystack's deserialization safety checks for every "
                          f"pipeline, and rag-mag builds pipelines only from {', '.join(ALLOWED_MODULES)}; unset "
                          f"{UNSAFE_ENV} to run rag-mag")
    extra = [pattern.strip() for pattern in os.environ.get(ALLOWLIST_ENV, "").split(",") if pattern.strip()]
    wider = [pattern for pattern in extra if not any(
        pattern.removesuffix(".*") == allowed or pattern.removesuffix(".*").startswith(allowed + ".")
        for allowed in ALLOWED_MODULES) or any(c in pattern.removesuffix(".*") for c in "*?[")]
    if wider:
        raise ConfigError(f"{ALLOWLIST_ENV} adds {', '.join(wider)} to the modules pipelines may load classes from; "
                          f"rag-mag builds pipelines only from {', '.join(ALLOWED_MODULES)}; unset {ALLOWLIST_ENV} "
                          "to run rag-mag")


def build_pipeline(data: dict[str, Any], source: str = "pipeline", components: dict[str, Any] | None = None):
    """Construct a Pipeline from a dict with the safe loader; errors become ConfigError/RagMagError.

    ``components``: ready instances to use instead of the dict's definitions of those names (tests)."""
    from haystack import Pipeline
    from haystack.core.errors import DeserializationError, PipelineError

    check_allowlist_env()
    try:
        reused = {"components": components} if components else {}
        return Pipeline.from_dict(data, allowed_modules=ALLOWED_MODULES, **reused)
    except (DeserializationError, PipelineError, ValueError, TypeError) as error:
        cause = error.__cause__
        if isinstance(cause, RagMagError):
            raise cause from None
        message = str(error).split("\n\nOriginal error: ")
        detail = f"{message[0].splitlines()[0]} ({message[1]})" if len(message) == 2 else str(error)
        detail = detail.split(" If you trust the source")[0]  # Haystack's own hint names the ways around it
        raise ConfigError(f"cannot build {source}: {detail}") from None


def load_pipeline(path: str | os.PathLike, overrides: dict[str, Any] | list[str] | None = None, *,
                  preflight: bool = False, components: dict[str, Any] | None = None):
    """Read a YAML pipeline, apply overrides to the init parameters, and construct it (nothing is warmed up).

    With ``preflight``, the vLLM servers it names are checked before it is built (a down server is
    reported in well under a second instead of after the model imports).
    """
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    data = read_pipeline_dict(path)
    _apply_url_env(data)
    data = apply_overrides(data, overrides or {})
    if preflight:
        preflight_dict(data)
    return build_pipeline(data, source=str(path), components=components)


# ---------------------------------------------------------------------------------------- running
def pipeline_section(pipeline, key: str) -> dict[str, Any]:
    """``metadata.rag_mag.<key>`` of a pipeline (``{}`` when absent)."""
    return ((pipeline.metadata or {}).get("rag_mag") or {}).get(key) or {}


def question_inputs(pipeline, question: str) -> dict[str, dict[str, Any]]:
    """Run inputs that send ``question`` to every socket listed in ``metadata.rag_mag.inputs.question``."""
    if not isinstance(question, str) or not question.strip():
        raise ConfigError("the question is empty; ask a question, e.g. rag-mag ask \"Who wrote Hamlet?\"")
    sockets = pipeline_section(pipeline, "inputs").get("question")
    if not sockets:
        raise ConfigError("this pipeline does not declare where the question goes (metadata.rag_mag.inputs.question"
                          "); give the run inputs explicitly, e.g. --input '{\"component\": {\"socket\": ...}}'")
    inputs: dict[str, dict[str, Any]] = {}
    for socket in sockets:
        name, _, socket_name = str(socket).partition(".")
        inputs.setdefault(name, {})[socket_name] = question.strip()
    return inputs


def expand_inputs(pipeline, inputs: dict[str, Any]) -> dict[str, Any]:
    """Run inputs with a top-level ``"question"`` spread to the pipeline's question sockets, and any other
    top-level name declared in ``metadata.rag_mag.inputs`` (e.g. reader.yaml's ``documents``) to its sockets."""
    inputs = dict(inputs)
    declared = pipeline_section(pipeline, "inputs")
    if "question" in inputs and declared.get("question"):
        for name, values in question_inputs(pipeline, inputs.pop("question")).items():
            inputs.setdefault(name, {}).update(values)
    for short, sockets in declared.items():
        if short == "question" or short not in inputs or short in pipeline.graph.nodes:
            continue
        value = inputs.pop(short)
        for socket in sockets if isinstance(sockets, list) else [sockets]:
            name, _, socket_name = str(socket).partition(".")
            inputs.setdefault(name, {})[socket_name] = value
    return inputs


def outputs_to_report(pipeline) -> set[str]:
    """Components whose outputs `run_pipeline` must keep (those named in ``metadata.rag_mag.outputs``)."""
    return {str(target).split(".")[0] for target in pipeline_section(pipeline, "outputs").values()}


def named_outputs(pipeline, result: dict[str, Any]) -> dict[str, Any]:
    """``{short name: value}`` for the outputs declared in ``metadata.rag_mag.outputs``."""
    named = {}
    for short, target in pipeline_section(pipeline, "outputs").items():
        name, _, socket = str(target).partition(".")
        if socket in result.get(name, {}):
            named[short] = result[name][socket]
    return named


def preflight_dict(data: dict[str, Any]) -> None:
    """The vLLM pre-flight on a pipeline dict, before the heavy imports of building it (fast CLI errors)."""
    from rag_mag.serving.llm.preflight import check_generators

    generators = []
    for name, component in data["components"].items():
        if isinstance(component, dict) and component.get("type") == VLLM_GENERATOR_TYPE:
            params = component.get("init_parameters") or {}
            generators.append((name, params.get("api_base_url") or VLLM_DEFAULT_URL, params.get("model"), None))
    check_generators(generators)


def run_pipeline(pipeline, inputs: dict[str, Any], *, preflight: bool = True,
                 include_outputs_from: set[str] | None = None) -> dict[str, Any]:
    """Pre-flight the vLLM servers, then run; a RagMagError raised inside a component comes out unwrapped."""
    from haystack.core.errors import PipelineRuntimeError

    from rag_mag.serving.llm.preflight import check_pipeline_servers

    if preflight:
        check_pipeline_servers(pipeline)
    keep = (include_outputs_from or set()) | outputs_to_report(pipeline)
    try:
        return pipeline.run(expand_inputs(pipeline, inputs), include_outputs_from=keep or None)
    except PipelineRuntimeError as error:
        explained = explain_run_error(error)
        if explained is None:
            raise
        raise explained from None


def explain_run_error(error: BaseException) -> RagMagError | None:
    """The one-line error a user should see for a failed pipeline run (None: an unexpected error).

    Covers our own errors raised inside components, a vLLM server that went away, a request vLLM refused
    (a prompt longer than the model's context above all) and a prompt template the Jinja sandbox blocks.
    """
    from haystack.core.errors import PipelineRuntimeError

    component = getattr(error, "component_name", None) if isinstance(error, PipelineRuntimeError) else None
    cause = error.__cause__ if isinstance(error, PipelineRuntimeError) and error.__cause__ else error
    if isinstance(cause, RagMagError):
        return cause
    kind = type(cause).__name__
    if kind in ("APIConnectionError", "APITimeoutError"):
        return ServerNotRunningError(f"lost the connection to the vLLM server during the run ({cause}); check it "
                                     "with `rag-mag serve-llm --status`")
    if kind == "SecurityError" and type(cause).__module__.startswith("jinja2"):
        where = f"the prompt template of component {component!r}" if component else "a prompt template"
        return ConfigError(f"{where} uses something the template sandbox blocks ({cause}); templates may only use "
                           "the variables and filters they are given: remove that expression from the template")
    status = getattr(cause, "status_code", None)
    if isinstance(status, int) and status >= 400:
        message = str(getattr(cause, "message", None) or cause)
        if status < 500 and any(marker in message.lower() for marker in CONTEXT_TOO_LONG):
            return PromptTooLongError(f"the question and the retrieved passages do not fit the model's context "
                                      f"(vLLM: {message}); shorten the question or retrieve fewer passages "
                                      "(--top-k)")
        return LLMRequestError(f"the vLLM server {'refused' if status < 500 else 'failed on'} the request "
                               f"(HTTP {status}): {message}")
    return None


class PromptTooLongError(ConfigError):
    """The prompt (question + passages) is longer than the generator's context."""


class LLMRequestError(RagMagError):
    """The vLLM server answered a request with an error status."""


def to_jsonable(value: Any) -> Any:
    """Pipeline outputs (Documents, answers, chat messages) as plain JSON values."""
    return json.loads(json.dumps(value, default=_json_default))


def _json_default(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
