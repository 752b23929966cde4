"""The shape of the package, kept by reading its imports with ``ast``.

Every ``import`` in ``shardkit/`` counts, wherever it sits: at module level,
inside a function (a loop hidden in a function is still a loop) or under
``if TYPE_CHECKING:`` (naming a type is depending on it). Relative imports are
resolved. The string table behind ``shardkit.__getattr__`` (``_LAZY``) is not an
import statement and is not seen; the package ``__init__`` is the top floor
anyway.

Rules (the floors are listed in docs/layout.md):
- no import cycle among shardkit's modules;
- an import only points down or sideways: a module never imports one on a
  higher floor (``FLOORS``), and every module has a floor;
- ``format/`` and ``io/`` import neither ``read/`` nor ``write/``;
- ``read/`` and ``write/`` never import each other;
- ``read/`` and ``index/`` never import each other, and ``write/`` never
  imports ``index/``; ``preview/`` (``shardkit show``) imports neither;
- no module is longer than ``MAX_MODULE_LINES``.

Each failure lists every offending module and the line of the import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "shardkit"
MAX_MODULE_LINES = 650

#: Floors from the ground up, by module or package prefix (the longest prefix
#: wins). An import may point to the same floor or lower, never higher.
FLOORS: dict[str, int] = {
    "shardkit.errors": 0,  # the exception tree
    "shardkit.world": 1,  # rank / worker arithmetic
    "shardkit.config": 1,  # loading YAML / mappings into option dataclasses
    "shardkit.format": 2,  # tar, manifest, index, codecs: bytes <-> samples
    "shardkit.io": 3,  # byte sources and destinations for every scheme
    "shardkit.write": 4,  # the writer
    "shardkit.read": 4,  # the reader
    "shardkit.preview": 4,  # `shardkit show`: a page of samples read at random (beside read/; registers its notebook views)
    "shardkit.index": 5,  # `shardkit index`: published shards read in place (uses write/'s publishing)
    "shardkit.revise": 5,  # changes to a published dataset (remove, append): the writer's driver, one way to publish
    "shardkit.probe": 5,  # `shardkit bench`: the storage's ceiling beside the loader, per worker count
    "shardkit.verify": 5,  # jobs and integrations over a written dataset
    "shardkit.ray": 5,
    "shardkit.transforms": 5,
    "shardkit.cli": 6,  # the command line and the package's front door
    "shardkit.__main__": 6,
    "shardkit": 6,
}


@dataclass(frozen=True)
class Edge:
    """``importer`` imports ``imported`` at ``path:line``."""

    importer: str
    imported: str
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported}  ({self.path}:{self.line})"


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root/package``."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its longest prefix that is one of ``modules`` (None if neither)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _resolve_base(importer: str, node: ast.ImportFrom, modules: dict[str, Path]) -> str:
    """The absolute module a ``from ... import`` names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    package = importer if _is_package(importer, modules) else importer.rpartition(".")[0]
    parts = package.split(".")
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    base = ".".join(parts)
    return f"{base}.{node.module}" if node.module else base


def import_edges(root: Path, package: str) -> tuple[dict[str, Path], list[Edge]]:
    """Every module of ``package`` and every import between two of them."""
    modules = module_files(root, package)
    edges = []
    for importer, path in modules.items():
        shown = str(path.relative_to(root))
        tree = ast.parse(path.read_text(), filename=shown)
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve_base(importer, node, modules)
                for alias in node.names:
                    # `from pkg import mod` imports the module pkg.mod when there is one.
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            for target in targets:
                imported = _known(target, modules)
                if imported is not None and imported != importer:
                    edges.append(Edge(importer, imported, shown, node.lineno))
    return modules, sorted(set(edges), key=lambda e: (e.importer, e.imported, e.line))


def strongly_connected(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    successors: dict[str, list[str]] = {n: [] for n in nodes}
    for edge in edges:
        successors[edge.importer].append(edge.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, next_child = work.pop()
            if next_child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = successors[node]
            if next_child < len(children):
                work.append((node, next_child + 1))
                child = children[next_child]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return sorted(components)


def floor_of(module: str) -> int | None:
    prefix = _known(module, {name: Path() for name in FLOORS})
    return None if prefix is None else FLOORS[prefix]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _report(title: str, lines: list[str]) -> str:
    text = f"{title} ({len(lines)}):\n" + "\n".join(f"  {line}" for line in lines)
    print(text)
    return text


# --- the package's own rules -------------------------------------------------

MODULES, EDGES = import_edges(ROOT, PACKAGE)


def test_every_module_has_a_floor() -> None:
    missing = [name for name in MODULES if floor_of(name) is None]
    assert not missing, _report("modules without a floor: add them to FLOORS", missing)


def test_no_import_cycles() -> None:
    lines = []
    for component in strongly_connected(list(MODULES), EDGES):
        members = set(component)
        inside = [str(e) for e in EDGES if e.importer in members and e.imported in members]
        lines.append("cycle among " + ", ".join(component) + ":\n    " + "\n    ".join(inside))
    assert not lines, _report("import cycles", lines)


def test_imports_never_point_up() -> None:
    upward = []
    for edge in EDGES:
        low, high = floor_of(edge.importer), floor_of(edge.imported)
        if low is not None and high is not None and high > low:
            upward.append(f"{edge}: floor {low} imports floor {high}")
    assert not upward, _report("imports from a lower floor to a higher one", upward)


def _imports_between(pairs: list[tuple[str, str]]) -> list[str]:
    """Every edge from a subpackage ``a`` of shardkit to ``b``, for ``(a, b)`` in ``pairs``."""
    return [
        str(edge)
        for edge in EDGES
        if any(_in(edge.importer, f"{PACKAGE}.{a}") and _in(edge.imported, f"{PACKAGE}.{b}") for a, b in pairs)
    ]


def test_format_and_io_import_neither_read_nor_write() -> None:
    bad = _imports_between([(low, high) for low in ("format", "io") for high in ("read", "write")])
    assert not bad, _report("format/ or io/ importing read/ or write/", bad)


def test_read_and_write_do_not_import_each_other() -> None:
    bad = _imports_between([("read", "write"), ("write", "read")])
    assert not bad, _report("read/ and write/ importing each other", bad)


def test_index_is_imported_by_neither_read_nor_write() -> None:
    bad = _imports_between([("read", "index"), ("index", "read"), ("write", "index")])
    assert not bad, _report("read/ and index/ importing each other, or write/ importing index/", bad)


def test_preview_imports_neither_write_nor_index() -> None:
    bad = _imports_between([("preview", "write"), ("preview", "index")])
    assert not bad, _report("preview/ importing write/ or index/", bad)


def test_changes_to_a_dataset_sit_above_the_reader_and_the_writer() -> None:
    """revise/ reads parents through the reader (a view of a view, takedowns included) and writes through the
    writer; neither imports it, and it does not reach into the indexer."""
    bad = _imports_between([("read", "revise"), ("write", "revise"), ("revise", "index")])
    assert not bad, _report("read/ or write/ importing revise/, or revise/ importing index/", bad)


def test_the_reader_does_not_import_the_page_that_draws_it() -> None:
    """preview/ registers the reader's notebook views (shardkit.read.notebook): no arrow from read/ up to it."""
    bad = _imports_between([("read", "preview")])
    assert not bad, _report("read/ importing preview/", bad)


def test_no_module_over_the_line_limit() -> None:
    long = []
    for name, path in MODULES.items():
        count = len(path.read_text().splitlines())
        if count > MAX_MODULE_LINES:
            long.append(f"{path.relative_to(ROOT)}: {count} lines (limit {MAX_MODULE_LINES}); split it by concept")
    assert not long, _report("modules over the line limit", long)


# --- the walker itself, on a package made for it ------------------------------


def _write_package(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_walker_sees_relative_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "from . import base\n",
        "pkg/low/base.py": "def late():\n    from ..high import top\n    return top\n",
        "pkg/low/other.py": "from .base import late\nimport pkg.low.base as b\n",
        "pkg/high/__init__.py": "",
        "pkg/high/top.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg.low import other\n"
            "import os, json\n"
        ),
    })
    modules, edges = import_edges(tmp_path, "pkg")
    assert set(modules) == {"pkg", "pkg.low", "pkg.low.base", "pkg.low.other", "pkg.high", "pkg.high.top"}
    assert {(e.importer, e.imported, e.line) for e in edges} == {
        ("pkg.low", "pkg.low.base", 1),
        ("pkg.low.base", "pkg.high.top", 2),
        ("pkg.low.other", "pkg.low.base", 1),
        ("pkg.low.other", "pkg.low.base", 2),
        ("pkg.high.top", "pkg.low.other", 3),
    }
    assert strongly_connected(list(modules), edges) == [["pkg.high.top", "pkg.low.base", "pkg.low.other"]]


def test_walker_finds_no_cycle_in_a_chain(tmp_path: Path) -> None:
    _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "from pkg.c import thing\n",
        "pkg/c.py": "thing = 1\n",
    })
    modules, edges = import_edges(tmp_path, "pkg")
    assert [(e.importer, e.imported) for e in edges] == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.c")]
    assert strongly_connected(list(modules), edges) == []
