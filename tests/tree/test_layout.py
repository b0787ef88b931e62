"""The package layout: torch-free layers stay torch-free, the parts import only what they may, and the
public API is importable from the package."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import hintpipe
from conftest import allow

TORCH_FREE = [
    "hintpipe",
    "hintpipe.spec",
    "hintpipe.units",
    "hintpipe.schedule.rules",
    "hintpipe.schedule.generators",
    "hintpipe.schedule.validation",
    "hintpipe.schedule.hint_csv",
    "hintpipe.sim",
    "hintpipe.observe.trace",
    "hintpipe.runtime",
    "hintpipe.runtime.errors",
    "hintpipe.modes",
    "hintpipe.device_choice",
    "hintpipe.runtime.injection",
    "hintpipe.runtime.checkpoint",
    "hintpipe.runtime.checkpoint.manifest",
    "hintpipe.runtime.checkpoint.links",
    "hintpipe.runtime.checkpoint.readers",
    "hintpipe.runtime.checkpoint.folder_lock",
    "hintpipe.runtime.checkpoint.run_folder",
    "hintpipe.options",
    "hintpipe.run_options",
    "hintpipe.schedule.resolve",
    "hintpipe.schedule.task_list",
    "hintpipe.apps.model_config",
    "hintpipe.apps.text_files",
    "hintpipe.own_code",
    "hintpipe.cli",
    "hintpipe.forming.cost",
    "hintpipe.forming.form",
    "hintpipe.sim.predict",
    "hintpipe.runtime.loop.ready_forecast",
    "hintpipe.scoreboard",
    "hintpipe.policy",
    # dispatch, the state machine the simulator and the runtime share: every module
    "hintpipe.dispatch",
    "hintpipe.dispatch.bounds",
    "hintpipe.dispatch.budgets",
    "hintpipe.dispatch.by_size",
    "hintpipe.dispatch.cost_model",
    "hintpipe.dispatch.engine",
    "hintpipe.dispatch.expected",
    "hintpipe.dispatch.fit",
    "hintpipe.dispatch.layout",
    "hintpipe.dispatch.per_position",
    "hintpipe.dispatch.policy",
    "hintpipe.dispatch.projected_live",
    "hintpipe.dispatch.rank_graph",
    "hintpipe.dispatch.rank_forecast",
    "hintpipe.dispatch.sample",
    "hintpipe.dispatch.scoreboard",
    "hintpipe.dispatch.variability",
]


def test_the_scheduling_core_imports_no_torch() -> None:
    code = f"import sys\nfor name in {TORCH_FREE!r}:\n    __import__(name)\nassert 'torch' not in sys.modules\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=allow(120))
    assert done.returncode == 0, done.stderr


def test_no_part_imports_one_it_must_not() -> None:
    # The planner and the simulator never reach into the runtime; the runtime never into apps or the CLI.
    script = Path(__file__).resolve().parents[2] / "scripts" / "import_graph.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=allow(60))
    assert done.returncode == 0, done.stderr
    assert "planner -> runtime" not in done.stdout and "sim -> runtime" not in done.stdout
    assert "runtime -> sim" not in done.stdout  # the runtime drives dispatch, not the simulator
    assert "runtime -> planner" in done.stdout  # the script sees arrows (the facade names the Plan type)


def test_the_public_api_is_importable_from_the_package() -> None:
    for name in hintpipe.__all__:
        assert getattr(hintpipe, name) is not None, name
    assert hintpipe.Pipeline.__module__ == "hintpipe.runtime.pipeline"
    assert hintpipe.Checkpointer.__module__ == "hintpipe.runtime.checkpoint.checkpointer"
    with pytest.raises(AttributeError, match=r"^module 'hintpipe' has no attribute 'Pipe'$"):
        hintpipe.Pipe  # noqa: B018


#: torch packages of a second or more to import each (DTensor, dynamo) that a rank needs only for what it uses:
#: a split backward, FSDP2, tensor parallelism, a checkpoint. Every rank process pays its imports at start-up.
HEAVY = ["torch.distributed.tensor", "torch.distributed.checkpoint", "torch.distributed.pipelining", "torch._dynamo"]


def test_a_rank_that_trains_and_its_launcher_import_only_what_they_use() -> None:
    # The pipeline, the training command's path and the launcher; then the launcher sizing each built-in model
    # on the meta device before its ranks start (before, torch's normal_ on a meta tensor imported dynamo: 1.5 s
    # of every launch's CPU).
    code = (
        "import sys\n"
        "import hintpipe.runtime.pipeline, hintpipe.apps.training, hintpipe.runtime.launch, hintpipe.cli.train\n"
        "from hintpipe.apps.models import ModelConfig, meta_layers\n"
        "for name in ('gpt-mini', 'mlp', 'mm-mini'):\n"
        "    meta_layers(ModelConfig(name, layers=2, hidden=32, heads=2, vocab=64, max_seq_len=65))\n"
        f"print([name for name in {HEAVY!r} if name in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=allow(120))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]"


def _first_optimizer_imports(rank: int, world: int) -> list[str]:
    import torch

    before = set(sys.modules)
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    return sorted(name for name in set(sys.modules) - before if name.startswith("torch."))


@pytest.mark.skipif(sys.platform != "linux", reason="ranks are forked from the fork server on Linux only")
def test_a_rank_forked_from_the_fork_server_builds_its_first_optimizer_without_importing() -> None:
    # Before, a rank's first optimizer imported torch._dynamo (1.5-3 s of CPU per rank per launch): see [Note: a
    # rank's first optimizer imports dynamo] in hintpipe.runtime.fork_server.
    from hintpipe.runtime.launch import run_ranks

    assert run_ranks(_first_optimizer_imports, 1, timeout=60.0) == [[]]


def _import_graph() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    return import_graph


def test_the_import_rules_find_a_cycle_and_a_floor_breached() -> None:
    rules = _import_graph()
    edges = {
        "hintpipe.runtime.loop.a": {"hintpipe.runtime.parallel.b"},  # the loop (floor 2) above the axes (3)
        "hintpipe.runtime.parallel.b": {"hintpipe.runtime.loop.a", "hintpipe.runtime.errors"},
        "hintpipe.runtime.errors": set(),
        "hintpipe.sim.x": {"hintpipe.sim.y"},
        "hintpipe.sim.y": {"hintpipe.sim.z"},
        "hintpipe.sim.z": {"hintpipe.sim.x"},
    }
    assert rules.cycles(edges) == [
        ["hintpipe.runtime.loop.a", "hintpipe.runtime.parallel.b"],
        ["hintpipe.sim.x", "hintpipe.sim.y", "hintpipe.sim.z"],
    ]
    assert rules.floor_breaches(edges) == [
        "floor: hintpipe.runtime.loop.a (floor 2) imports hintpipe.runtime.parallel.b (floor 3)"
    ]
    # The options' enums are the foundation's (hintpipe.modes), below the config the runtime takes.
    assert [rules.part(m) for m in ("hintpipe.options", "hintpipe.device", "hintpipe.modes")] == [
        "options",
        "base",
        "base",
    ]


def test_no_test_waits_on_a_process_without_a_timeout() -> None:
    """A wait without a bound turns a hung run into a hung suite: every ``subprocess.run`` and every
    ``communicate()``/``wait()`` of a process in the tests gives a ``timeout``."""
    unbounded = []
    for path in sorted(Path(__file__).resolve().parents[1].rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called, keywords = ast.unparse(node.func), {k.arg for k in node.keywords}
            waits = called.endswith((".communicate", ".wait")) and not node.args
            waits = waits and not any(word in called.lower() for word in ("event", "done", "barrier", "work"))
            runs = called in ("subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output")
            if (runs or waits) and "timeout" not in keywords:
                unbounded.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert unbounded == []


#: The calls whose ``timeout=`` is a test's own wait (on a process, a thread, a queue), not a runtime watchdog.
_WAITS = (".run", ".communicate", ".wait", ".join", ".get", ".close", ".check_output", ".check_call")
#: What a wait's timeout may be: scaled by the audit (see [Note: a test's waits are audited] in conftest.py).
_SCALED = ("allow(", "hang_bound(", "2 * hang_bound(", "WITHIN", "max(0.0, deadline")


def test_every_wait_of_a_test_is_scaled_by_the_audit() -> None:
    """Each test's own timeout is ``allow(...)`` or ``hang_bound(...)``, so that the suite run with
    ``HINTPIPE_TEST_WAIT_SCALE=0.5`` halves every one of them: a bare number would escape the audit."""
    bare = []
    for path in sorted(Path(__file__).resolve().parents[1].rglob("*.py")):
        if path.name == "conftest.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            value = None
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(_WAITS):
                value = next((k.value for k in node.keywords if k.arg == "timeout"), None)
            elif isinstance(node, ast.BinOp) and ast.unparse(node.left) in ("time.monotonic()", "time.time()"):
                value = node.right if isinstance(node.op, ast.Add) else None
            text = "" if value is None else ast.unparse(value)
            if value is not None and not text.startswith(_SCALED) and text not in ("timeout", "within", "None"):
                bare.append(f"{path.name}:{getattr(node, 'lineno', 0)}: {text}")
    assert bare == []


#: A cross-reference in a docstring or a comment: ``:class:`~hintpipe.dispatch.scoreboard.Scoreboard```.
_REFERENCE = re.compile(r":(?:class|func|mod|meth|attr|data|exc):`~?(hintpipe(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")


def _resolves(reference: str) -> bool:
    """Whether ``reference`` names a module, or a name (a class's field included) inside one."""
    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            fields = {**getattr(found, "__dataclass_fields__", {}), **getattr(found, "__annotations__", {})}
            if not hasattr(found, name):
                return name in fields and name == parts[-1]
            found = getattr(found, name)
        return True
    return False


def test_every_cross_reference_names_what_exists() -> None:
    """A module or name that moved leaves its old path in docstrings (``hintpipe.hint.Hint`` after ``schedule/``
    was made): every ``:class:`hintpipe...``` reference in the source resolves."""
    source = Path(hintpipe.__file__).parent
    references = {found for path in source.rglob("*.py") for found in _REFERENCE.findall(path.read_text())}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the 0.7 shims of moved modules
        stale = sorted(reference for reference in references if not _resolves(reference))
    assert len(references) > 200 and stale == []


# -- tests mirror the tree ----------------------------------------------------------------------------------------

TESTS = Path(__file__).resolve().parents[1]


def _package_folder(module: str) -> Path:
    """Where the tests of ``module`` (``hintpipe.runtime.loop.step_loop``) live: the folder of its package under
    tests/ (``tests/runtime``; the foundation's modules, ``hintpipe.options``, are tested in tests/ itself)."""
    parts = module.split(".")[1:-1]
    return TESTS.joinpath(*parts[:1]) if parts else TESTS


def _own(folder: Path, module: str) -> bool:
    """Whether the tests in ``folder`` are of ``module``'s own package (its folder, or one below it)."""
    own = _package_folder(module)
    return folder == own or (own != TESTS and own in folder.parents)


def _imported_by(path: Path) -> set[str]:
    """The hintpipe modules (and names in them) a test file imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hintpipe"):
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("hintpipe")}
    return found


def test_every_module_is_reached_by_a_test_of_its_own_package() -> None:
    """tests/ mirrors src/hintpipe/: a module of ``hintpipe/runtime`` is imported by a test under tests/runtime/,
    a foundation module by a test in tests/ itself, so a new module comes with a test of its own package (a
    ratchet when tests/ was laid out by package in 0.7, 80 modules short; none since)."""
    source = Path(hintpipe.__file__).parent
    modules = sorted(
        ".".join(("hintpipe", *path.relative_to(source).with_suffix("").parts))
        for path in source.rglob("*.py")
        if path.stem not in ("__init__", "__main__")
    )
    reached: dict[Path, set[str]] = {}
    for path in TESTS.rglob("test_*.py"):
        reached.setdefault(path.parent, set()).update(_imported_by(path))
    unreached = [
        module
        for module in modules
        if not any(module in names for folder, names in reached.items() if _own(folder, module))
    ]
    assert unreached == []
