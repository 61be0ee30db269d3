"""The layout the project keeps (docs/architecture.md): packages by stage, imports pointing one way.

Checked from the source text (``ast``), so a stray import fails here rather than in a review:
``sqlgen`` and ``checkpoint`` import nothing of ``applier`` but the event types, the error
root and the slots the compiled loops cimport (leaf modules), the codec imports nothing of the
later stages, and ``applier/`` keeps few top-level modules. The Cython sources (``.pyx``,
``.pxd``) are read too, with a pattern instead of ``ast``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The leaf modules: the event types, the error root and the event slots' offsets that the compiled
# loops cimport (applier/codec/_slots.pxd).
LEAVES = {"applier.codec.events", "applier.errors", "applier.codec._slots"}


# Cython's imports and cimports, at the start of a line (in a function too): ``from X cimport``,
# ``from X import``, ``cimport X``, ``import X``; ast cannot parse a .pyx or .pxd.
_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\b|c?import\s+([\w.]+))", re.MULTILINE)


def _project_imports(path: Path) -> set[str]:
    """Modules of the project a source file imports (absolute imports; the project uses no others)."""
    found: set[str] = set()
    if path.suffix in (".pyx", ".pxd"):
        names = [a or b for a, b in _CYTHON_IMPORT.findall(path.read_text())]
        return {n for n in names if n.split(".")[0] in ("applier", "sqlgen", "checkpoint")}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ("applier", "sqlgen", "checkpoint"))
    return found


def _sources(package: str) -> list[Path]:
    """The package's Python and Cython sources (``.py``, ``.pyx``, ``.pxd``)."""
    return sorted(p for p in (ROOT / package).rglob("*") if p.suffix in (".py", ".pyx", ".pxd"))


def test_sqlgen_and_checkpoint_import_only_the_event_types_and_the_error_root_of_applier() -> None:
    for package in ("sqlgen", "checkpoint"):
        for path in _sources(package):
            stray = {m for m in _project_imports(path) if m.startswith("applier") and m not in LEAVES}
            assert not stray, f"{path.relative_to(ROOT)} imports {sorted(stray)}"


def test_the_leaf_modules_import_nothing_of_the_project() -> None:
    for module in LEAVES:
        [path] = [p for s in (".py", ".pxd") if (p := ROOT / (module.replace(".", "/") + s)).is_file()]
        assert _project_imports(path) == set(), path


def test_the_codec_imports_no_later_stage() -> None:
    later = ("applier.stream", "applier.apply", "applier.daemon", "applier.catchup", "applier.commands")
    for path in _sources("applier/codec"):
        stray = {m for m in _project_imports(path) if m.startswith(later)}
        assert not stray, f"{path.relative_to(ROOT)} imports {sorted(stray)}"


def test_the_stages_never_import_the_commands() -> None:
    for package in ("applier/codec", "applier/stream", "applier/apply", "applier/daemon", "applier/catchup"):
        for path in _sources(package):
            stray = {m for m in _project_imports(path) if m.startswith("applier.commands")}
            assert not stray, f"{path.relative_to(ROOT)} imports {sorted(stray)}"


def test_the_cython_sources_are_read_too() -> None:
    plan = ROOT / "sqlgen" / "_plan.pyx"
    assert plan in _sources("sqlgen")
    assert {"applier.codec._slots", "applier.codec.events", "sqlgen"} <= _project_imports(plan)


def test_applier_keeps_few_top_level_modules() -> None:
    modules = sorted(p.name for p in (ROOT / "applier").glob("*.py"))
    assert len(modules) <= 10, modules
