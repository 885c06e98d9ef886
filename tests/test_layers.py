"""docs/design.md's layers as data, checked on every import of the package, the DAGs, the demo, the
fault harness and the benchmarks (an AST walk: nothing is imported; lazy and ``TYPE_CHECKING``
imports count).

A failure names the file, its line and the import, and the rule it breaks. The rules are fixed by
changing the import, not ``LAYERS``: a change here is a change of the design, made in
docs/design.md ("Layers") in the same commit.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "airflow_provider_exactly_once"
#: Beside the package, not in the wheel: walked too, and never imported by the package.
BESIDE = ("bench", "dags", "demo", "fault_harness")

#: Top down. A unit (a folder, written with its "/", or a module at the package's root) imports only
#: units of the layers below its own: never one above, nor another unit of its own layer.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("bench/",),
    ("dags/",),
    ("fault_harness/",),
    ("demo/",),
    ("__init__",),  # the package's public names, resolved on first use
    ("plugins/", "cli/"),
    ("operations/",),
    ("task_groups", "recovery/"),
    ("operators/", "sensors/"),
    ("triggers/",),
    ("runtime/",),
    ("hooks/", "observability/"),
    # What talks to Airflow beside the layers: below them, and above everything a Spark driver imports.
    ("version_compat", "upstream_private", "get_provider_info"),
    ("spark/", "tables"),
    ("sinks/", "checkpoints/", "store/", "table_spec/"),
    ("filesystems", "type_mapping"),
    ("core/", "extras", "defaults", "version"),
)

#: What ``core/`` may import besides the standard library and its own modules.
#: pydantic_core is pydantic's own engine, installed with it: a custom type's schema is written with it.
CORE_THIRD_PARTY = frozenset({"pydantic", "pydantic_core"})


@dataclass(frozen=True)
class Import:
    source: str  # the importing unit
    target: str  # the imported unit
    file: str
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} imports {self.module} ({self.source} -> {self.target})"


def _unit(root: Path, package: str, beside: Sequence[str], module: str) -> str | None:
    """The unit a dotted module name belongs to, or ``None`` outside the walked tree."""
    parts = module.split(".")
    if parts[0] in beside:
        return f"{parts[0]}/"
    if parts[0] != package:
        return None
    if len(parts) == 1:
        return "__init__"
    if (root / package / parts[1]).is_dir():
        return f"{parts[1]}/"
    return parts[1] if (root / package / f"{parts[1]}.py").exists() else None


def _source_unit(package: str, relative: Path) -> str:
    top = relative.parts[0]
    if top != package:
        return f"{top}/"
    if len(relative.parts) == 2:
        return "__init__" if relative.name == "__init__.py" else relative.stem
    return f"{relative.parts[1]}/"


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names; for ``from m import a, b``: ``m.a`` and ``m.b``
    (each may be a module of its own), and ``m`` where ``a`` is a name in it."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        name = ".".join([*base, *([node.module] if node.module else [])])
    else:
        name = node.module or ""
    return [f"{name}.{alias.name}" for alias in node.names]


def walk(root: Path, package: str, beside: Sequence[str] = BESIDE) -> tuple[list[Import], dict[str, list[Import]]]:
    """Every import from one unit of another, once per statement and unit; and every import of
    each unit by the top-level name it imports (``target``), for the third-party rules."""
    between: list[Import] = []
    by_unit: dict[str, list[Import]] = defaultdict(list)
    files = [f for top in (package, *beside) if (root / top).is_dir() for f in sorted((root / top).rglob("*.py"))]
    for path in files:
        relative = path.relative_to(root)
        module = ".".join(relative.with_suffix("").parts)
        is_package = path.name == "__init__.py"
        if is_package:
            module = module.removesuffix(".__init__")
        source = _source_unit(package, relative)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            line = getattr(node, "lineno", 0)
            seen: set[str] = set()
            for name in _imported_names(node, module, is_package):
                owner = name if isinstance(node, ast.Import) else name.rsplit(".", 1)[0]
                own = _unit(root, package, beside, name)
                target, shown = (own, name) if own is not None else (_unit(root, package, beside, owner), owner)
                by_unit[source].append(Import(source, owner.split(".")[0], str(relative), line, owner))
                if target is not None and target != source and target not in seen:
                    seen.add(target)
                    between.append(Import(source, target, str(relative), line, shown))
    return between, by_unit


def layer_violations(imports: Iterable[Import], layers: Sequence[Sequence[str]] = LAYERS) -> list[str]:
    """Each import that does not point down the layers, or names a unit no layer holds."""
    depth = {unit: level for level, units in enumerate(layers) for unit in units}
    found = []
    for imp in imports:
        if imp.source not in depth or imp.target not in depth:
            unplaced = imp.source if imp.source not in depth else imp.target
            found.append(f"{imp}: {unplaced} has no layer in LAYERS (docs/design.md 'Layers')")
        elif depth[imp.target] <= depth[imp.source]:
            where = "its own layer" if depth[imp.target] == depth[imp.source] else "a layer above"
            found.append(f"{imp}: {imp.target} is in {where}; imports point downwards only")
    return sorted(set(found))


def cycles(imports: Iterable[Import]) -> list[list[str]]:
    """The units that import each other round a circle (strongly connected, more than one)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(unit: str) -> None:
        index[unit] = low[unit] = len(index)
        stack.append(unit)
        for other in sorted(graph.get(unit, ())):
            if other not in index:
                visit(other)
                low[unit] = min(low[unit], low[other])
            elif other in stack:
                low[unit] = min(low[unit], index[other])
        if low[unit] == index[unit]:
            component = []
            while (member := stack.pop()) != unit:
                component.append(member)
            component.append(unit)
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def foreign_imports(by_unit: dict[str, list[Import]], unit: str, package: str, allowed: Iterable[str]) -> list[str]:
    """The imports of ``unit`` that are neither the standard library, its package, nor ``allowed``."""
    keep = {package, *allowed}
    return sorted(
        {
            str(imp)
            for imp in by_unit.get(unit, [])
            if imp.target not in sys.stdlib_module_names and imp.target not in keep
        }
    )


IMPORTS, BY_UNIT = walk(ROOT, PACKAGE)


def test_every_import_points_down_the_layers() -> None:
    assert layer_violations(IMPORTS) == []


def test_every_folder_and_root_module_of_the_package_has_a_layer() -> None:
    placed = {unit for units in LAYERS for unit in units}
    units = {
        f"{path.name}/" if path.is_dir() else path.stem
        for path in (ROOT / PACKAGE).iterdir()
        if (path.is_dir() and (path / "__init__.py").exists()) or path.suffix == ".py"
    }
    assert units - placed == set(), "give each a layer in LAYERS and docs/design.md 'Layers'"


def test_core_imports_no_airflow_spark_pyiceberg_sqlalchemy_or_fsspec() -> None:
    assert foreign_imports(BY_UNIT, "core/", PACKAGE, CORE_THIRD_PARTY) == []


def test_nothing_in_the_package_imports_what_is_beside_it() -> None:
    beside = {f"{name}/" for name in BESIDE}
    assert [str(imp) for imp in IMPORTS if imp.target in beside and imp.source not in beside] == []


def test_no_circle_of_folders() -> None:
    assert cycles(IMPORTS) == []


def _tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


@pytest.fixture
def broken(tmp_path: Path) -> tuple[list[Import], dict[str, list[Import]]]:
    """A small package that breaks every rule once."""
    _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/core/__init__.py": "",
            "pkg/core/rules.py": "import sqlalchemy\nfrom ..runtime import assembly\n",
            "pkg/runtime/__init__.py": "",
            "pkg/runtime/assembly.py": "from pkg.core import rules\nfrom pkg.stray import thing\n",
            "pkg/stray.py": "from pkg.runtime.assembly import x\n",
            "pkg/sinks/__init__.py": "from pkg import checkpoints\n",
            "pkg/checkpoints/__init__.py": "import demo.world\n",
            "demo/__init__.py": "",
            "demo/world.py": "from pkg.runtime import assembly\n",
        },
    )
    return walk(tmp_path, "pkg", beside=("demo",))


def test_the_checker_finds_each_kind_of_violation(broken: tuple[list[Import], dict[str, list[Import]]]) -> None:
    imports, by_unit = broken
    layers = (("demo/",), ("runtime/",), ("sinks/", "checkpoints/"), ("core/",))
    found = layer_violations(imports, layers)
    assert (
        "pkg/core/rules.py:2 imports pkg.runtime.assembly (core/ -> runtime/): runtime/ is in a layer above; imports point downwards only"
        in found
    )
    assert (
        "pkg/sinks/__init__.py:1 imports pkg.checkpoints (sinks/ -> checkpoints/): checkpoints/ is in its own layer; imports point downwards only"
        in found
    )
    assert (
        "pkg/checkpoints/__init__.py:1 imports demo.world (checkpoints/ -> demo/): demo/ is in a layer above; imports point downwards only"
        in found
    )
    assert any(
        line.startswith("pkg/runtime/assembly.py:2 imports pkg.stray.thing ") and "stray has no layer" in line
        for line in found
    )
    assert not any("demo/world.py" in line for line in found)  # the demo above the package: downwards
    assert cycles(imports) == [["core/", "runtime/", "stray"]]
    assert foreign_imports(by_unit, "core/", "pkg", {"pydantic"}) == [
        "pkg/core/rules.py:1 imports sqlalchemy (core/ -> sqlalchemy)"
    ]
