"""The package's layers, read from the source with ``ast`` (nothing is imported).

Low to high: the shared modules at the root of ``rag_mag/`` -> ``metrics`` -> ``retriever`` -> ``components``
-> ``reader`` -> ``serving`` -> ``ingestion`` -> ``bench`` -> ``adapt`` -> ``demo`` -> ``cli``; a module's layer is
its first folder under ``rag_mag/``, so a sub-package (``bench/report/``, ``bench/crossover/``) is in its folder's
layer.
A module may import its own layer and the layers below it, never one above, also not lazily inside a function;
no two modules may import each other, directly or through others; and the root holds at most ``MAX_ROOT_FILES``
modules, so that new code lands in a layer.

Inside a layer that ``PARTS`` names, its parts are ordered too: the retriever's model (its top modules) below
``training/`` and ``data/``, which do not import each other; in serving, ``processes`` below the vLLM server
(``llm/``) and PostgreSQL (``db/``), which do not import each other, below the pipelines and indexing at serving's top.

And the rooms stay small: no module has more than ``MAX_MODULE_LINES`` lines, and no function or method more than
``MAX_FUNCTION_LINES``, counted from its ``def`` line to its last line (decorators not counted, its docstring and
comments counted). No folder holds more than ``MAX_FOLDER_MODULES`` modules, and fewer than ``MAX_SHARED_PREFIX``
modules of one folder share a prefix up to an underscore: past that, the prefix is a folder waiting to be made.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = "rag_mag"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE
# above the root, low to high
LAYERS = ["metrics", "retriever", "components", "reader", "serving", "ingestion", "bench", "adapt", "demo", "cli"]
# Inside a layer, its parts low to high (a set: parts of one rank). A part is a sub-package or a module at the
# layer's top; "." stands for the layer's other top modules. A module may import its own part and lower ones, never a
# higher one nor another part of its rank.
PARTS = {
    "retriever": [{"."}, {"data", "training"}],
    "serving": [{"processes"}, {"db", "llm"}, {"."}],
}
MAX_ROOT_FILES = 8
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
MAX_FOLDER_MODULES = 20
MAX_SHARED_PREFIX = 4


def module_name(path: Path) -> str:
    """``rag_mag/bench/runner.py`` -> ``rag_mag.bench.runner``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def layer_of(module: str) -> int:
    """0 for the root modules, then 1 + the index of the module's folder in ``LAYERS``."""
    parts = module.split(".")
    if len(parts) == 1 or (PACKAGE_DIR / f"{parts[1]}.py").is_file():
        return 0
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module}: folder rag_mag/{parts[1]}/ has no layer; add it to LAYERS in {__file__}")
    return 1 + LAYERS.index(parts[1])


def layer_name(layer: int) -> str:
    return "root" if layer == 0 else LAYERS[layer - 1]


def part_of(module: str) -> tuple[str, str] | None:
    """``(layer, part)`` of a module in a layer that ``PARTS`` names, else None.

    ``rag_mag.retriever.training.trainer`` -> ``("retriever", "training")``; ``rag_mag.retriever.encoder`` and the
    package ``rag_mag.retriever`` itself -> ``("retriever", ".")``."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in PARTS:
        return None
    named = set().union(*PARTS[parts[1]])
    return parts[1], parts[2] if len(parts) > 2 and parts[2] in named else "."


def part_rank(layer: str, part: str) -> int:
    return next(rank for rank, parts in enumerate(PARTS[layer]) if part in parts)


def part_violations(graph: dict[str, dict[str, int]]) -> list[str]:
    """Imports inside a layer of ``PARTS`` that point up its parts or across parts of one rank."""
    violations = []
    for module, targets in graph.items():
        for target, line in sorted(targets.items()):
            source, destination = part_of(module), part_of(target)
            if source is None or destination is None or source[0] != destination[0] or source == destination:
                continue
            layer = source[0]
            if part_rank(layer, destination[1]) >= part_rank(layer, source[1]):
                violations.append(f"{module} ({layer}: {source[1]}) imports {target} ({layer}: {destination[1]}) "
                                  f"at line {line}")
    return violations


def imported_modules(module: str, path: Path, known: set[str]) -> dict[str, int]:
    """``{imported rag_mag module: line}`` for every import in ``path``, at top level or inside functions.

    ``from X import name`` counts as an import of ``X.name`` when that is a module, else of ``X``."""
    is_package = path.name == "__init__.py"
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            while target not in known and "." in target:  # an attribute of a module: the module itself
                target = target.rsplit(".", 1)[0]
            found.setdefault(target, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, one step up per extra dot
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                add(submodule if submodule in known else source, node.lineno)
    found.pop(module, None)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    modules = package_modules()
    known = set(modules)
    return {module: imported_modules(module, path, known) for module, path in modules.items()}


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def function_lengths(path: Path) -> dict[str, tuple[int, int]]:
    """``{qualified name: (lines, def line)}`` of every function and method in ``path``, nested ones included
    (``Class.method``, ``outer.<locals>.inner``); a function spans its ``def`` line to its last line."""
    lengths: dict[str, tuple[int, int]] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lengths[name] = (child.end_lineno - child.lineno + 1, child.lineno)
                visit(child, name + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "")
    return lengths


# ---------------------------------------------------------------------------------------------- the rules
def test_no_module_imports_a_higher_layer():
    graph = import_graph()
    violations = [
        f"{module} ({layer_name(layer_of(module))}) imports {target} ({layer_name(layer_of(target))}) at line {line}"
        for module, targets in graph.items() for target, line in sorted(targets.items())
        if layer_of(target) > layer_of(module)
    ]
    assert not violations, "imports against the layer order (root < " + " < ".join(LAYERS) + "):\n" + \
        "\n".join(violations)


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(
        f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)) + f" -> {cycle[-1]}"


def test_inside_a_layer_imports_point_down_its_parts():
    violations = part_violations(import_graph())
    assert not violations, "imports against the order of a layer's parts (" + "; ".join(
        f"{layer}: " + " < ".join("/".join(sorted(rank)) for rank in ranks) for layer, ranks in PARTS.items()) + \
        "):\n" + "\n".join(violations)


def test_every_sub_package_of_an_ordered_layer_is_a_part():
    for layer, ranks in PARTS.items():
        folder = PACKAGE_DIR / layer
        sub_packages = {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
        top_modules = {p.stem for p in folder.glob("*.py")}
        named = set().union(*ranks) - {"."}
        assert sub_packages <= named, f"rag_mag/{layer}/ has sub-packages {sorted(sub_packages - named)} that " \
            f"PARTS[{layer!r}] does not order; add them"
        missing = sorted(named - sub_packages - top_modules)
        assert not missing, f"PARTS[{layer!r}] names {missing}, which rag_mag/{layer}/ does not hold"


def test_the_package_root_stays_small():
    root_files = sorted(path.name for path in PACKAGE_DIR.glob("*.py"))
    assert len(root_files) <= MAX_ROOT_FILES, (
        f"{len(root_files)} modules at the root of rag_mag/ ({', '.join(root_files)}); at most {MAX_ROOT_FILES}: "
        "put the new one in the layer it belongs to")


def test_every_folder_has_a_layer():
    for folder in sorted(p for p in PACKAGE_DIR.iterdir() if (p / "__init__.py").is_file()):
        assert folder.name in LAYERS, f"rag_mag/{folder.name}/ has no layer; add it to LAYERS"


def test_no_module_is_over_the_line_limit():
    long = [f"{path.relative_to(PACKAGE_DIR.parent)}: {count} lines" for path in package_modules().values()
            if (count := line_count(path)) > MAX_MODULE_LINES]
    assert not long, f"modules over {MAX_MODULE_LINES} lines; split them along their seams, one concept per " \
        "module:\n" + "\n".join(long)


def test_no_function_is_over_the_line_limit():
    long = [f"{path.relative_to(PACKAGE_DIR.parent)}:{line} {name}: {lines} lines"
            for path in package_modules().values()
            for name, (lines, line) in function_lengths(path).items() if lines > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (def line to last line); split them into " \
        "well-named parts:\n" + "\n".join(long)


# ---------------------------------------------------------------------------------------- the checker itself
def test_measures_functions_from_def_to_last_line(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        "import functools\n\n\n"
        "@functools.cache\n"            # line 4: a decorator is not counted
        "def top(x):\n"                 # line 5
        "    def inner():\n"
        "        return x\n"
        "    return inner\n\n\n"       # line 8
        "class Thing:\n"
        "    async def method(self):\n"  # line 12
        "        \"\"\"A docstring.\"\"\"\n"
        "\n"
        "        return 1\n")            # line 15
    assert function_lengths(source) == {"top": (4, 5), "top.<locals>.inner": (2, 6), "Thing.method": (4, 12)}
    assert line_count(source) == 15


def test_resolves_absolute_relative_and_lazy_imports(tmp_path, monkeypatch):
    package = tmp_path / PACKAGE
    (package / "serving").mkdir(parents=True)
    (package / "cli").mkdir()
    for name in ("__init__.py", "errors.py", "serving/__init__.py", "serving/low.py", "cli/__init__.py",
                 "cli/main.py"):
        (package / name).write_text("")
    (package / "serving" / "high.py").write_text(
        "from . import low\nfrom rag_mag.errors import ConfigError\n\n"
        "def f():\n    from rag_mag.cli.main import main\n    import rag_mag.serving.low as other\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE_DIR", package)
    graph = import_graph()
    assert graph["rag_mag.serving.high"] == {"rag_mag.serving.low": 1, "rag_mag.errors": 2, "rag_mag.cli.main": 5}
    assert layer_of("rag_mag.cli.main") > layer_of("rag_mag.serving.high") > layer_of("rag_mag.errors") == 0


def test_a_sub_package_is_in_the_layer_of_its_first_folder():
    bench = 1 + LAYERS.index("bench")
    assert layer_of("rag_mag.bench.report.model") == layer_of("rag_mag.bench.crossover.runner") == \
        layer_of("rag_mag.bench.runner") == bench
    assert layer_of("rag_mag.serving.pipelines") < bench < layer_of("rag_mag.adapt.run")


def test_orders_the_parts_of_a_layer():
    graph = {
        "rag_mag.retriever.encoder": {"rag_mag.retriever.strategies": 1, "rag_mag.retriever.training.config": 2},
        "rag_mag.retriever.training.trainer": {"rag_mag.retriever.encoder": 1, "rag_mag.retriever.data.mining": 3},
        "rag_mag.retriever.data.mining": {"rag_mag.retriever.bm25": 1, "rag_mag.retriever.data.spec": 2},
        "rag_mag.serving.pipelines": {"rag_mag.serving.llm.preflight": 1, "rag_mag.serving.answers": 2},
        "rag_mag.serving.db.postgres": {"rag_mag.serving.processes": 1, "rag_mag.serving.llm.records": 4},
        "rag_mag.serving.processes": {"rag_mag.serving.llm.settings": 5},
        "rag_mag.cli.train": {"rag_mag.retriever.training.trainer": 1},
    }
    assert part_violations(graph) == [
        "rag_mag.retriever.encoder (retriever: .) imports rag_mag.retriever.training.config (retriever: training) "
        "at line 2",
        "rag_mag.retriever.training.trainer (retriever: training) imports rag_mag.retriever.data.mining "
        "(retriever: data) at line 3",
        "rag_mag.serving.db.postgres (serving: db) imports rag_mag.serving.llm.records (serving: llm) at line 4",
        "rag_mag.serving.processes (serving: processes) imports rag_mag.serving.llm.settings (serving: llm) at line 5",
    ]
    assert layer_of("rag_mag.retriever.training.trainer") == layer_of("rag_mag.retriever.encoder")


@pytest.mark.parametrize(("graph", "expected"), [
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {}}, None),
    ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}}, ["a", "b", "c", "a"]),
    ({"a": {"b": 1}, "b": {"b2": 1}, "b2": {"b": 1}}, ["b", "b2", "b"]),
])
def test_find_cycle(graph, expected):
    assert find_cycle(graph) == expected


def test_folders_stay_small_and_name_what_they_hold():
    problems = []
    for folder in sorted({path.parent for path in PACKAGE_DIR.rglob("*.py")}):
        modules = sorted(path.stem for path in folder.glob("*.py"))
        where = folder.relative_to(PACKAGE_DIR.parent)
        if len(modules) > MAX_FOLDER_MODULES:
            problems.append(f"{where}/ holds {len(modules)} modules (at most {MAX_FOLDER_MODULES}): split it")
        prefixes: dict[str, list[str]] = {}
        for name in modules:
            if "_" in name.strip("_"):
                prefixes.setdefault(name.strip("_").split("_")[0], []).append(name)
        problems += [f"{where}/: {', '.join(names)} share the prefix {prefix}_; make {where}/{prefix}/"
                     for prefix, names in sorted(prefixes.items()) if len(names) >= MAX_SHARED_PREFIX]
    assert not problems, "\n".join(problems)
