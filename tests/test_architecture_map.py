"""docs/architecture.md's module map names every module of ``surge/``, and only modules that exist.

A module counts as listed when its path stands anywhere in the map, or its file name stands in a
row whose first cell names its folder (``surge/layers/``) or a file of that folder
(``surge/model/registry.py``, ``loader.py``). An ``__init__.py`` that holds only a docstring is a
package marker and needs no row.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PATH = re.compile(r"(?<![\w/.])(surge/[\w/]+\.py)\b")
_NAME = re.compile(r"(?<![\w/.])(\w+\.py)\b")


def _map_rows() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def _row_folders(first_cell: str) -> set[str]:
    """The folders a row speaks for: those its first cell names, or holds a named file of."""
    folders = set()
    for item in re.findall(r"`([^`]+)`", first_cell):
        if item.startswith("surge/"):
            folders.add(item if item.endswith("/") else item.rsplit("/", 1)[0] + "/")
    return folders


def _listed() -> tuple[set[str], set[str]]:
    """(paths the map names in full, ``folder + name`` of the bare file names of each row)."""
    paths: set[str] = set()
    relative: set[str] = set()
    for row in _map_rows():
        first, _, rest = row[1:].partition(" | ")
        paths.update(_PATH.findall(row))
        for folder in _row_folders(first):
            relative.update(folder + name for name in _NAME.findall(first + " " + rest))
    return paths, relative


def _needs_a_row(path: Path) -> bool:
    if path.name != "__init__.py":
        return True
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return not (
        len(body) <= 1 and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)
    )


def _modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "surge").rglob("*.py")}


def test_every_module_is_in_the_map() -> None:
    paths, relative = _listed()
    missing = sorted(m for m in _modules() if _needs_a_row(ROOT / m) and m not in paths and m not in relative)
    assert not missing, f"modules missing from docs/architecture.md's module map: {missing}"


def test_every_module_in_the_map_exists() -> None:
    paths, _ = _listed()
    modules = _modules()
    absent = sorted(p for p in paths if p not in modules)
    assert not absent, f"docs/architecture.md's module map names modules that do not exist: {absent}"


def test_first_cells_name_existing_files() -> None:
    """A bare file name in a row's first cell (``loader.py`` after ``surge/model/registry.py``)
    is a module of that row's folder."""
    modules = _modules()
    absent = []
    for row in _map_rows():
        first = row[1:].partition(" | ")[0]
        folder = ""
        for item in re.findall(r"`([^`]+)`", first):
            if item.startswith("surge/"):
                folder = item if item.endswith("/") else item.rsplit("/", 1)[0] + "/"
            elif item.endswith(".py") and folder + item not in modules:
                absent.append(folder + item)
    assert not absent, f"docs/architecture.md's module map names modules that do not exist: {absent}"
