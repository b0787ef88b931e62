"""Print the import graph between hintpipe's parts, and fail on an arrow that must not exist.

The parts are the folders (``schedule/``, ``sim/``, ``planner/``, ``runtime/``,
``forming/``, ``apps/``, ``cli/``, ``observe/``), the scoreboard, and the base modules
below all of them (``choice``, ``spec``, ``units``, ``options``, ``device``,
``tensor_bytes``). Every ``import`` of a hintpipe module counts, wherever it
stands (at the top, in a function, under ``TYPE_CHECKING``): a dependency is a
dependency, even when it is deferred.

Usage: ``python scripts/import_graph.py [SRC]`` (``SRC``: another tree's ``src/hintpipe``, to compare;
exit status 1 when a forbidden arrow exists).
"""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src" / "hintpipe"
#: Arrows that must not exist: the planner and the simulator never reach into the runtime, and the runtime
#: never into the applications or the command line; forming (data) needs no runtime, and the runtime no forming.
FORBIDDEN = {("planner", "runtime"), ("sim", "runtime"), ("runtime", "apps"), ("runtime", "cli")}
FORBIDDEN |= {("forming", "runtime"), ("runtime", "forming")}
FOLDERS = ("schedule", "sim", "planner", "runtime", "forming", "apps", "cli", "observe")


def part(module: str) -> str:
    """The part a dotted module name (``hintpipe.runtime.loop.step_loop``) belongs to."""
    pieces = module.split(".")
    if len(pieces) == 1:
        return "hintpipe"
    if pieces[1] == "__main__":
        return "cli"
    return pieces[1] if pieces[1] in FOLDERS or pieces[1] == "scoreboard" else "base"


def module_name(path: Path) -> str:
    relative = path.relative_to(SOURCE.parent).with_suffix("")
    names = list(relative.parts)
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def imports(path: Path) -> set[str]:
    """The hintpipe modules ``path`` imports (relative imports resolved)."""
    found: set[str] = set()
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("hintpipe")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.startswith("hintpipe"):
                found.add(base)
    return found


def graph() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(from part, to part) -> the (module, imported module) pairs behind that arrow."""
    arrows: dict[tuple[str, str], list[tuple[str, str]]] = collections.defaultdict(list)
    for path in sorted(SOURCE.rglob("*.py")):
        source = module_name(path)
        for target in sorted(imports(path)):
            a, b = part(source), part(target)
            if a != b:
                arrows[(a, b)].append((source, target))
    return arrows


def main() -> int:
    global SOURCE
    if len(sys.argv) > 1:
        SOURCE = Path(sys.argv[1]).resolve()
    arrows = graph()
    width = max(len(f"{a} -> {b}") for a, b in arrows)
    for (a, b), pairs in sorted(arrows.items()):
        mark = "  FORBIDDEN" if (a, b) in FORBIDDEN else ""
        print(f"{f'{a} -> {b}':<{width}}  {len(pairs):3d} imports{mark}")
    bad = [(arrow, pairs) for arrow, pairs in sorted(arrows.items()) if arrow in FORBIDDEN]
    for (a, b), pairs in bad:
        for source, target in pairs:
            print(f"forbidden: {source} imports {target} ({a} -> {b})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
