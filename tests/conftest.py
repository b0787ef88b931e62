"""Shared helpers for the test suite."""

from __future__ import annotations

import argparse
import atexit
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.cli import build_parser
from hintpipe.cli.config_file import apply_config
from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint
from hintpipe.sim.simulator import SimResult, Simulator

if TYPE_CHECKING:
    from hintpipe.apps.training import TrainConfig

# Raw data files are prepared into a cache folder on a run's first use (hintpipe.data.cache): the tests' own, not
# the user's ~/.cache, removed when the session ends (ranks the tests start inherit it).
if "HINTPIPE_CACHE" not in os.environ:
    os.environ["HINTPIPE_CACHE"] = tempfile.mkdtemp(prefix="hintpipe-test-cache-")
    atexit.register(shutil.rmtree, os.environ["HINTPIPE_CACHE"], True)

# The session's Hugging Face zoo plans, made once for every worker ([Note: zoo plans are made once per test
# session] in tests/hf_zoo.py).
if "HINTPIPE_TEST_ZOO_PLANS" not in os.environ:
    os.environ["HINTPIPE_TEST_ZOO_PLANS"] = tempfile.mkdtemp(prefix="hintpipe-test-zoo-plans-")
    atexit.register(shutil.rmtree, os.environ["HINTPIPE_TEST_ZOO_PLANS"], True)

# One intra-op thread, as every CPU rank runs: two test workers share the machine's two cores, and the planner
# times nodes by the thread's CPU time only then (see [Note: a CPU's clock] in hintpipe.device).
torch.set_num_threads(1)


def simulate(
    hint: Hint | str,
    ranks: int = 4,
    microbatches: int = 8,
    chunks: int = 1,
    policy: Policy = Policy.FIXED,
    *,
    forward: float = 1.0,
    backward: float = 1.0,
    weight: float = 1.0,
) -> SimResult:
    """One run of ``hint`` on expected (noise-free) costs."""
    if isinstance(hint, str):
        hint = generate_hint(hint, ranks, microbatches, chunks)
    costs = CostModel.uniform(hint.stages, forward=forward, backward=backward, weight=weight)
    return Simulator(hint, costs).run(policy)


#: Seconds a test allows for ranks to start (spawn, import torch, join the group) on a loaded 2-core machine.
STARTUP_ALLOWANCE = 60.0


def parse_cli(argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed as ``hintpipe`` parses it, its ``--config`` file applied (the path itself left out, so
    that a run from a file and one from the same flags compare equal)."""
    parser = build_parser()
    apply_config(parser, argv)
    args = parser.parse_args(argv)
    del args.config
    return args


#: The factor on every test's own wait (see :func:`allow`): ``HINTPIPE_TEST_WAIT_SCALE=0.5`` on a quiet machine
#: audits that no test's own timeout is within 2x of its time (see [Note: a test's waits are audited]).
WAIT_SCALE = float(os.environ.get("HINTPIPE_TEST_WAIT_SCALE", "1"))

# [Note: a test's waits are audited]
# A test's own timeout (how long it waits on a process, a thread or a queue, or polls to a deadline) that sits
# close to the time the test takes on a quiet machine fails on a busy one. Every such wait is ``allow(seconds)``
# or :func:`hang_bound` (tests/tree/test_layout.py holds the suite to it), and both scale by WAIT_SCALE: the suite
# run with HINTPIPE_TEST_WAIT_SCALE=0.5 on a quiet machine passes only if every wait is at least twice what it
# needs. The runtime's own watchdogs (``timeout=`` of a pipeline, of run_ranks) are not a test's waits: the
# fault tests set them short on purpose, and scaling them would change what those tests test.


def allow(seconds: float) -> float:
    """The seconds a test waits for something that should take far less (a process to end, a thread, a line):
    ``seconds``, scaled by :data:`WAIT_SCALE` (see [Note: a test's waits are audited])."""
    return seconds * WAIT_SCALE


def hang_bound(watchdog: float, grace: float = 5.0) -> float:
    """The wall-clock limit for a run that must end by its watchdog: three times the
    watchdog plus the launcher's grace, plus start-up. These tests check that nothing
    hangs, not how fast the failure is seen, so the margin is wide on purpose (scaled as
    :func:`allow`'s)."""
    return allow(3.0 * (watchdog + grace) + STARTUP_ALLOWANCE)


def raised_here(caught: Any) -> list[warnings.WarningMessage]:
    """The warnings that ``pytest.warns``' ``caught`` recorded, less any ResourceWarning: those come from garbage
    collection, which may run inside the block and finalise an object an earlier test left (an unclosed pipe of
    a subprocess), not from the code the block called."""
    return [w for w in caught if not issubclass(w.category, ResourceWarning)]


#: A gpt-mini small enough for multi-process tests of training runs.
SMALL_GPT = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)


#: The command line's flags of a small 2-rank run of :data:`SMALL_GPT` (the checkpoint tests' runs, with a 20 s
#: watchdog).
SMALL_CLI = ["--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2", "--microbatches", "4"]
SMALL_CLI += ["--microbatch-size", "2", "--policy", "fixed", "--timeout", "20.0"]


#: ``hintpipe train`` on :data:`SMALL_CLI`'s run, printing its result as JSON, as a user starts it.
TRAIN_CLI = [sys.executable, "-m", "hintpipe", "train", *SMALL_CLI, "--json"]


def refused_in_one_line(argv: list[str]) -> str:
    """What the command ``argv`` said when it refused to start: exit status 2 and one line on stderr."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=allow(120))
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture(scope="session")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-step run's folder, a checkpoint after each step (the command line's, as a user's): made once per test
    process, for tests that copy it (:func:`copied`) and change the copy."""
    folder = tmp_path_factory.mktemp("saved") / "ck"
    done = trained(folder, 2, "--checkpoint-every", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def trained(folder: Path, steps: int, *more: str) -> subprocess.CompletedProcess[str]:
    """``hintpipe train`` (:data:`TRAIN_CLI`) to step ``steps`` with its checkpoints in ``folder`` and the flags
    ``more`` (``--resume``, ...), run to its end: its exit status and output."""
    argv = [*TRAIN_CLI, "--steps", str(steps), "--checkpoint-dir", str(folder), *more]
    return subprocess.run(argv, capture_output=True, text=True, timeout=hang_bound(20.0))


def copied(saved: Path, tmp_path: Path) -> Path:
    """A copy of the run folder ``saved`` as ``tmp_path/ck``."""
    folder = tmp_path / "ck"
    shutil.copytree(saved, folder)
    return folder


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Whether two state dicts hold the same names and bitwise equal tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def small_run(**changes: object) -> TrainConfig:
    """A 2-rank, 6-step, ``fixed`` training run of :data:`SMALL_GPT` on variable lengths that returns its
    parameters; ``changes`` override any field."""
    from hintpipe.apps.training import TrainConfig  # torch: imported by the tests that train

    base = TrainConfig.of(
        model=SMALL_GPT,
        ranks=2,
        microbatches=4,
        microbatch_size=2,
        steps=6,
        policy="fixed",
        seq_len_dist=SeqLenDist(16, 0.5),
        timeout=20.0,
        return_state=True,
    )
    return base.replaced(**changes)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Seconds per test file (setup, call and teardown), longest first: the suite's time budget at a glance."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                seconds[report.nodeid.split("::")[0]] += report.duration
    if not seconds:
        return
    terminalreporter.write_sep("=", "seconds per test file")
    for path, spent in sorted(seconds.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{spent:7.1f}  {path}")
    terminalreporter.write_line(f"{sum(seconds.values()):7.1f}  in all")


#: The test files that take longest, longest first (about 300 s for test_gpu_check, one test, down to 40 s,
#: summed over setup, calls and teardown in a clean clone's run on 4 workers of a 2-core machine, one core busy).
#: They start first: each worker takes one file at a time, so a long file started last runs on alone at the end,
#: and the suite's wall clock is then its share of the sum plus that tail. A file missing here keeps its place
#: after them: test_zoo_stages among those, as it loads the plans test_zoo_autocast makes (see [Note: zoo plans
#: are made once per test session] in tests/hf_zoo.py).
LONGEST_FILES = (
    "test_gpu_check.py",
    "test_stopping.py",
    "test_readme.py",
    "test_model_folders.py",
    "test_kept_order.py",
    "test_zoo_autocast.py",
    "test_hf_models.py",
    "test_recovery.py",
    "test_reliability.py",
    "test_mesh.py",
    "test_train.py",
    "test_user_launch.py",
    "test_planner_search.py",
    "test_moe_capture.py",
    "test_hf_plans.py",
    "test_runtime.py",
    "test_torchrun_ties.py",
    "test_run_folder.py",
    "test_folder_lock.py",
    "test_links.py",
    "test_reading.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files first (see :data:`LONGEST_FILES`); scripts/test.sh keeps this order on its workers
    (``--no-loadscope-reorder``: pytest-xdist would otherwise order files by their number of tests)."""
    rank = {name: position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
