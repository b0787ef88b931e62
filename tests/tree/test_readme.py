"""The README's code runs as pasted: every Python block is extracted from the file and run as a script.

A block is a whole script (the README says so), run in a fresh folder with this interpreter; the one that
plans a user's model also runs under torchrun, the other way users start ranks. The training block without
its ``if __name__ == "__main__":`` guard, the commonest paste, is refused in one line naming the line to move.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import allow

README = Path(__file__).resolve().parents[2] / "README.md"
TIMEOUT = 300


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.DOTALL | re.MULTILINE)


def _run(script: str, folder: Path, *launcher: str) -> subprocess.CompletedProcess[str]:
    path = folder / "script.py"
    path.write_text(script)
    command = [*(launcher or [sys.executable]), str(path)]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=allow(TIMEOUT))


def _numbers(text: str) -> list[float]:
    return [float(v) for v in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)]


def _titled(block: str) -> str:
    return next((line for line in block.splitlines() if line.strip()), "")[:60]


def test_the_readme_has_the_blocks_it_shows() -> None:
    blocks = python_blocks()
    assert len(blocks) == 9, [_titled(b) for b in blocks]
    assert sum("share_plan" in b for b in blocks) == 1


@pytest.fixture(scope="module")
def checkpointing(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The README's two checkpointing scripts pasted in order into one fresh folder and run: the first is also
    its block's run as pasted (a fresh folder either way) and the first run of the training block run again."""
    folder = tmp_path_factory.mktemp("checkpointing")
    scripts = [b for b in python_blocks() if "Checkpointer(" in b]
    runs = [_run(block, folder) for block in scripts]
    listing = sorted(p.name for p in folder.iterdir() if p.name.startswith("ckpt"))
    return {"folder": folder, "scripts": scripts, "runs": runs, "listing": listing}


@pytest.mark.parametrize("index", range(9))
def test_every_python_block_of_the_readme_runs_as_pasted(
    index: int, tmp_path: Path, checkpointing: dict[str, Any]
) -> None:
    block = python_blocks()[index]
    done = checkpointing["runs"][0] if block == checkpointing["scripts"][0] else _run(block, tmp_path)
    assert done.returncode == 0, f"block {index} ({_titled(block)}):\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), "every block prints what it computed"
    if "hintpipe.simulate(" in block:  # 1F1B on 2 ranks, 4 micro-batches, F = 1, B = 2: the maths, exactly
        assert done.stdout == "15.0 12.0 0.8 (2.0, 1.0)\n"
    # Nothing the ranks made is left for the launcher's resource tracker to report (the planning block's ranks
    # run torch.fx's interpreter, whose progress bar makes a multiprocessing lock).
    assert "leaked" not in done.stderr, done.stderr[-3000:]
    if "share_plan" in block:  # the user's own model: also under torchrun, and its plan file was written
        assert (tmp_path / "gpt2.plan").is_file()
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        again = _run(block, tmp_path, *torchrun)
        assert again.returncode == 0, again.stderr[-3000:]
        # run_ranks returns every rank's loss however the ranks started: the launcher prints the list once; under
        # torchrun every rank prints it (broadcast: one value). (The runs differ: GPT-2's dropout draws afresh.)
        spawned, under_torchrun = _numbers(done.stdout), _numbers(again.stdout)
        assert len(spawned) == 2 and len(under_torchrun) == 4 and len(set(under_torchrun)) == 1
        assert all(0 < loss < 10 for loss in spawned + under_torchrun)


def test_the_training_block_run_again_in_its_folder_says_there_is_nothing_left(checkpointing: dict[str, Any]) -> None:
    block = next(b for b in python_blocks() if "Checkpointer" in b)
    assert block == checkpointing["scripts"][0]
    first = checkpointing["runs"][0]  # the block's first run in its folder
    assert first.returncode == 0, first.stderr[-3000:]
    assert len(_numbers(first.stdout)) == 2  # each rank's loss
    again = _run(block, checkpointing["folder"])
    assert again.returncode == 0, again.stderr[-3000:]
    said = "ckpt holds all 4 steps of its run: nothing left to train (delete it to start again)"
    assert again.stdout.strip() == repr([said, said])


def test_the_training_block_without_its_main_guard_is_refused_in_one_line(tmp_path: Path) -> None:
    block = next(b for b in python_blocks() if "Checkpointer" in b)
    head, _, guarded = block.partition('if __name__ == "__main__":')
    unguarded = head + textwrap.dedent(guarded.split("\n", 1)[1])
    done = _run(unguarded, tmp_path)
    assert done.returncode == 1
    line = next(i + 1 for i, text in enumerate(unguarded.splitlines()) if "run_ranks(rank_main, 2)" in text)
    assert done.stderr.strip().splitlines()[-1] == (
        f"hintpipe.runtime.errors.RankFailure: {tmp_path / 'script.py'}, line {line}: run_ranks starts processes "
        'that import this script again; put the code that calls it under `if __name__ == "__main__":`'
    )


def test_the_readme_s_checkpointing_scripts_pasted_in_order_into_one_folder_both_run(
    checkpointing: dict[str, Any],
) -> None:
    # Each keeps its own checkpoint folder: the second is not refused as "written for another model".
    assert len(checkpointing["scripts"]) == 2
    for done in checkpointing["runs"]:
        assert done.returncode == 0, done.stderr[-3000:]
    assert checkpointing["listing"] == ["ckpt", "ckpt-loop"]
