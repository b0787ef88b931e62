"""Print the import graph between hintpipe's parts, and fail on an arrow that must not exist.

The parts are the folders (``schedule/``, ``dispatch/``, ``sim/``, ``planner/``, ``runtime/``,
``forming/``, ``data/``, ``apps/``, ``cli/``, ``observe/``), the options
table (``options`` and ``run_options``: the config every part reads, the runtime included, so it stands
below the runtime, the applications and the command line, and refers only to the enums of
``hintpipe.modes`` and of the parts below it) and the foundation below all of them (``choice``,
``spec``, ``units``, ``option``, ``modes``, ``device``, ``device_choice``, ``tensor_bytes``,
``sampler``, ``renamed``). The 0.7 shims of the old ``hintpipe.scoreboard`` and ``hintpipe.policy`` count as
``dispatch``, whose names they give. Every ``import`` of a hintpipe module counts, wherever it stands (at the
top, in a function, under ``TYPE_CHECKING``): a dependency is a dependency, even when it is deferred.
The one exception is named: the options table may name the runtime's types of its object-valued
options under ``TYPE_CHECKING`` (:data:`TYPE_ONLY`), for the type checker; it runs none of their code.

Four rules, each failing the script (each a function of a graph, which its tests make up):

- **forbidden arrows** between parts (:data:`FORBIDDEN`), and the foundation imports only the foundation;
  the floors of the torch-free core, lowest first: the foundation, ``schedule`` (what a schedule is),
  ``dispatch`` (the state machine both drivers share), then the simulator and the runtime side by side, neither
  importing the other;
- **the torch-free parts** (:data:`TORCH_FREE`: ``schedule``, ``dispatch``, ``sim``) import no torch
  themselves (what they import of hintpipe is held to the arrows above);
- **the runtime's floors** (:data:`RUNTIME_FLOORS`): a runtime module imports runtime modules of its own
  floor or below, never above;
- **no cycle** between modules: two modules that import each other (through any chain) are one concept
  split in two, or one that should name a protocol instead.

Usage: ``python scripts/import_graph.py [SRC]`` (``SRC``: another tree's ``src/hintpipe``, to compare;
exit status 1 when a rule is broken).
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
#: The data (corpora prepared into shards, read by documents) needs neither the runtime nor the applications.
FORBIDDEN |= {("data", "runtime"), ("data", "apps"), ("data", "cli")}
#: Dispatch (the scoreboard, its policy, rank graphs, budgets, the fit, the engine, the expected plan, the bounds,
#: samples, variability) is the torch-free state machine the simulator and the runtime share: it imports only
#: the schedule and the foundation, and the schedule (what a schedule is) imports no dispatch.
FORBIDDEN |= {("dispatch", above) for above in ("runtime", "sim", "planner", "apps", "cli", "options")}
FORBIDDEN |= {("dispatch", above) for above in ("forming", "data", "observe")}
FORBIDDEN |= {("schedule", "dispatch")}
#: The runtime and the simulator are two drivers of dispatch: the runtime takes nothing of the simulator's.
FORBIDDEN |= {("runtime", "sim")}
#: The options table is the config every part reads: nothing above it may be imported by it (an arrow up
#: through the options would make the runtime, which takes its config, import what imports it).
FORBIDDEN |= {("options", above) for above in ("runtime", "apps", "cli", "planner", "sim", "data")}
#: Arrows allowed for imports under ``TYPE_CHECKING`` only: the types of the runtime's object-valued options
#: (``EmulatedCosts``, ``FsdpOptions``, ``TiedParameter``) in the config's fields.
TYPE_ONLY = {("options", "runtime")}
#: The parts that import no torch: the scheduling core, which ``hintpipe simulate`` and the command line's checks
#: run without it.
TORCH_FREE = ("schedule", "dispatch", "sim")
FOLDERS = ("schedule", "dispatch", "sim", "planner", "runtime", "forming", "data", "apps", "cli", "observe")
#: The foundation: modules every part may use, which use none of them.
FOUNDATION = "base"
#: The runtime's floors, lowest first: a floor's modules are its base modules (``runtime/errors.py``) or
#: subpackages (``runtime/loop/``); everything else in the runtime is the top floor (the assembly, the parts, the
#: step engine, the facade, the launcher, faults).
RUNTIME_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "model_names", "liveness", "launcher_env"}),
    frozenset({"transport", "checkpoint"}),
    frozenset({"loop"}),
    frozenset({"parallel"}),
)


def part(module: str) -> str:
    """The part a dotted module name (``hintpipe.runtime.loop.step_loop``) belongs to."""
    pieces = module.split(".")
    if len(pieces) == 1:
        return "hintpipe"
    if pieces[1] == "__main__":
        return "cli"
    if pieces[1] in FOLDERS:
        return pieces[1]
    if pieces[1] in ("scoreboard", "policy"):  # the 0.7 shims of the old names, which give dispatch's
        return "dispatch"
    if pieces[1] in ("options", "run_options"):  # the options table, in two modules
        return "options"
    return FOUNDATION


def runtime_floor(module: str) -> int | None:
    """The floor of a runtime module (0 lowest), or None outside the runtime (and for the package itself)."""
    pieces = module.split(".")
    if len(pieces) < 3 or pieces[1] != "runtime":
        return None
    for floor, names in enumerate(RUNTIME_FLOORS):
        if pieces[2] in names:
            return floor
    return len(RUNTIME_FLOORS)


def module_name(path: Path) -> str:
    relative = path.relative_to(SOURCE.parent).with_suffix("")
    names = list(relative.parts)
    if names[-1] == "__init__":
        names.pop()
    return ".".join(names)


def imports(path: Path) -> dict[str, bool]:
    """The hintpipe modules ``path`` imports (relative imports resolved), each with whether it is imported only
    under ``if TYPE_CHECKING:``."""
    found: dict[str, bool] = {}
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in node.body
        for inner in ast.walk(statement)
    }
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("hintpipe")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.startswith("hintpipe"):
                names = [base]
        for name in names:
            found[name] = found.get(name, True) and id(node) in typing_only
    return found


def graph() -> dict[tuple[str, str], list[tuple[str, str, bool]]]:
    """(from part, to part) -> the (module, imported module, only under ``TYPE_CHECKING``) behind that arrow."""
    arrows: dict[tuple[str, str], list[tuple[str, str, bool]]] = collections.defaultdict(list)
    for path in sorted(SOURCE.rglob("*.py")):
        source = module_name(path)
        for target, type_only in sorted(imports(path).items()):
            a, b = part(source), part(target)
            if a != b:
                arrows[(a, b)].append((source, target, type_only))
    return arrows


def forbidden(arrows: dict[tuple[str, str], list[tuple[str, str, bool]]]) -> list[str]:
    """Every import behind a forbidden arrow (one a :data:`TYPE_ONLY` arrow allows under ``TYPE_CHECKING``
    aside), and every import of the foundation's of a part."""
    out = []
    for (a, b), pairs in sorted(arrows.items()):
        if (a, b) not in FORBIDDEN and not (a == FOUNDATION and b != FOUNDATION):
            continue
        for source, target, type_only in pairs:
            if not (type_only and (a, b) in TYPE_ONLY):
                out.append(f"forbidden: {source} imports {target} ({a} -> {b})")
    return out


def outside_imports(path: Path) -> set[str]:
    """The top-level packages other than hintpipe that ``path`` imports (``torch`` for ``torch.distributed``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"hintpipe"}


def torch_breaches(outside: dict[str, set[str]]) -> list[str]:
    """Modules of a :data:`TORCH_FREE` part that import torch (``outside``: module -> what it imports outside
    hintpipe)."""
    return [
        f"torch: {module} imports torch ({part(module)} is torch-free)"
        for module, names in sorted(outside.items())
        if part(module) in TORCH_FREE and "torch" in names
    ]


def module_imports() -> dict[str, set[str]]:
    """Module -> the hintpipe modules it imports (each an existing module or package)."""
    found = {module_name(path): set(imports(path)) for path in sorted(SOURCE.rglob("*.py"))}
    return {source: {t for t in targets if t in found and t != source} for source, targets in found.items()}


def floor_breaches(edges: dict[str, set[str]]) -> list[str]:
    """Runtime modules that import a runtime module of a higher floor."""
    out = []
    for source, targets in sorted(edges.items()):
        here = runtime_floor(source)
        for target in sorted(targets):
            there = runtime_floor(target)
            if here is not None and there is not None and there > here:
                out.append(f"floor: {source} (floor {here}) imports {target} (floor {there})")
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other through some chain (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges)))
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(groups)


def main() -> int:
    global SOURCE
    if len(sys.argv) > 1:
        SOURCE = Path(sys.argv[1]).resolve()
    arrows = graph()
    width = max(len(f"{a} -> {b}") for a, b in arrows)
    bad = forbidden(arrows)
    for (a, b), pairs in sorted(arrows.items()):
        mark = "  FORBIDDEN" if any(f"({a} -> {b})" in line for line in bad) else ""
        typed = sum(type_only for *_, type_only in pairs)
        note = f" ({typed} under TYPE_CHECKING)" if typed else ""
        print(f"{f'{a} -> {b}':<{width}}  {len(pairs):3d} imports{note}{mark}")
    bad += torch_breaches({module_name(path): outside_imports(path) for path in sorted(SOURCE.rglob("*.py"))})
    for line in bad:
        print(line, file=sys.stderr)
    edges = module_imports()
    breaches = floor_breaches(edges)
    for line in breaches:
        print(line, file=sys.stderr)
    looped = cycles(edges)
    for group in looped:
        print(f"cycle: {' <-> '.join(group)}", file=sys.stderr)
    return 1 if bad or breaches or looped else 0


if __name__ == "__main__":
    sys.exit(main())
