"""``rag-mag run``: run any YAML pipeline with parameter overrides and JSON inputs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rag_mag.cli import DefaultsHelpFormatter
from rag_mag.errors import ConfigError


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "run", help="run a YAML pipeline (with --set overrides and --input JSON)",
        description="Load a Haystack YAML pipeline (only classes from rag_mag, haystack and haystack_integrations), "
                    "override component init parameters with --set name.param=value (the value is read as YAML; "
                    "a pipeline may also declare short names such as index=DIR), run it with the --input JSON, "
                    "and print the outputs as JSON. A top-level \"question\" in --input goes to every socket the "
                    "pipeline declares for it.",
        formatter_class=DefaultsHelpFormatter)
    parser.add_argument("pipeline", help="pipeline YAML file, e.g. pipelines/rag.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="NAME.PARAM=VALUE",
                        help="override a component parameter before the pipeline is built (repeatable)")
    parser.add_argument("--input", default="{}", metavar="JSON",
                        help="run inputs as a JSON object, or @FILE to read it from a file")
    parser.add_argument("--no-preflight", action="store_true",
                        help="skip the check that the vLLM servers of the pipeline answer")
    return parser


def parse_inputs(text: str) -> dict[str, Any]:
    source = "--input"
    if text.startswith("@"):
        path = Path(text[1:])
        if not path.is_file():
            raise ConfigError(f"--input file {path} does not exist")
        source, text = str(path), path.read_text(encoding="utf-8")
    try:
        inputs = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source} is not valid JSON ({error}); give an object such as "
                          "'{\"question\": \"Who wrote Hamlet?\"}'") from None
    if not isinstance(inputs, dict):
        raise ConfigError(f"{source} must be a JSON object, got {type(inputs).__name__}")
    return inputs


def run(args: argparse.Namespace) -> int:
    from rag_mag.serving.pipelines import load_pipeline, parse_overrides, run_pipeline, to_jsonable

    inputs = parse_inputs(args.input)
    pipeline = load_pipeline(args.pipeline, parse_overrides(args.overrides), preflight=not args.no_preflight)
    result = run_pipeline(pipeline, inputs, preflight=not args.no_preflight)
    print(json.dumps(to_jsonable(result), indent=2, ensure_ascii=False))
    return 0
