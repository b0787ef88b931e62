"""Input dimensions torch.export fixes though they were to vary ([Note: dimensions the capture fixes] in
:mod:`hintpipe.planner.export_trace`): said in a warning by the capture, and a run whose micro-batches would
vary in one refused before any rank starts, where before its first micro-batch of another length failed inside
its stage (``select(): index 8 out of range``, Mamba's and RWKV's sequential scans)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from hintpipe.apps.model_config import ModelConfig
from hintpipe.cli import main
from hintpipe.cli.train_model import _check_fixed_shapes
from hintpipe.forming.form import Forming
from hintpipe.planner.capture import capture
from hintpipe.planner.fixed_shapes import FixedShapeWarning

SCAN = """
import torch
from torch import nn


class Scan(nn.Module):
    '''A recurrence over positions in Python, as a state-space model's reference scan is.'''

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(11, 4), nn.Linear(4, 11)

    def forward(self, ids):
        x = self.embed(ids)
        state, out = torch.zeros_like(x[:, 0]), []
        for i in range(x.shape[1]):
            state = 0.5 * state + x[:, i]
            out.append(state)
        return self.head(torch.stack(out, dim=1))


def scan():
    return Scan(), torch.zeros(2, 6, dtype=torch.long), nn.functional.cross_entropy
"""


def _scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"scan_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text(SCAN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_loop_over_positions_is_said_and_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = __import__(_scan(tmp_path, monkeypatch))
    model, example, _ = module.scan()
    with pytest.warns(FixedShapeWarning) as warned:
        captured = capture(model, example=(example,))
    assert captured.fixed == (("input 0", 1, 6),)
    assert str(warned[0].message) == (
        "torch.export fixed Scan's input 0's dimension 1 at 6 (its code depends on those sizes: a loop over "
        "positions, a size read as a number): its stages take inputs of those sizes alone; give an example of the "
        "sizes it will train on"
    )
    assert capture(Scaled(), example=(example,), kwargs={"scale": 2.0}).fixed == ()  # exported: a keyword


def test_a_length_the_program_guards_to_one_size_is_fixed_too() -> None:
    """A branch on the length keeps it free in the program but guards it (Bamba's chunked scan): the stages
    run without the guards, so the capture names the dimension."""
    with pytest.warns(FixedShapeWarning, match=r"Chunked's input 0's dimension 1 at 8 "):
        captured = capture(Chunked(), example=(torch.zeros(2, 8, dtype=torch.long),))
    assert captured.fixed == (("input 0", 1, 8),)


class Chunked(nn.Module):
    """Rows padded to whole chunks of 4 where they are not: a branch on the length."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(11, 4), nn.Linear(4, 11)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        if x.shape[1] % 4:
            x = nn.functional.pad(x, (0, 0, 0, 4 - x.shape[1] % 4))
        out: torch.Tensor = self.head(x.reshape(x.shape[0], -1, 4, 4).sum(dim=2))
        return out


class Scaled(nn.Module):
    """Positions computed by tensors alone: every dimension stays free."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(11, 4), nn.Linear(4, 11)

    def forward(self, ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        out: torch.Tensor = self.head(self.embed(ids).cumsum(dim=1) * scale)
        return out


def test_a_run_whose_micro_batches_vary_in_a_fixed_size_is_refused() -> None:
    model = ModelConfig("factory", layers=1, hidden=4, heads=1, vocab=11, max_seq_len=7, source="scans:scan")
    length = (("input 0", 1, 6),)
    with pytest.raises(ValueError) as refused:
        _check_fixed_shapes(length, model, Forming.CROP, rows=2)
    assert str(refused.value) == (
        "--model scans:scan: torch.export fixed its input 0's dimension 1 at 6 (its code depends on those sizes: a "
        "loop over positions, a size read as a number), so its stages run micro-batches of one shape, and "
        "--forming crop makes others; --forming concat makes every micro-batch 2 rows of 6 tokens (--max-seq-len "
        "sets it), the shape it is then captured at"
    )
    _check_fixed_shapes(length, model, Forming.CONCAT, rows=2)  # every micro-batch 2 rows of 6
    rows = (("input 0", 0, 2),)
    _check_fixed_shapes(rows, model, Forming.CROP, rows=2)  # crop's micro-batches have 2 rows each
    with pytest.raises(ValueError, match=r"dimension 0 at 2 .* and --forming padded makes others"):
        _check_fixed_shapes(rows, model, Forming.PADDED, rows=2)


def test_the_command_line_refuses_it_before_a_rank_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = _scan(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    flags = ["train", "--model", f"{name}:scan", "--ranks", "2", "--microbatches", "2", "--seq-len-dist", "fixed:6"]
    assert main(flags) != 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"hintpipe train: error: --model {name}:scan: torch.export fixed its input 0's dimension 1 at 6 (its code "
        "depends on those sizes: a loop over positions, a size read as a number), so its stages run micro-batches "
        "of one shape, and --forming crop makes others; --forming concat makes every micro-batch 4 rows of 6 tokens "
        "(--max-seq-len sets it), the shape it is then captured at"
    )


def test_a_plans_first_stage_refuses_another_size_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hintpipe.planner.plan import plan

    model, example, _ = __import__(_scan(tmp_path, monkeypatch)).scan()
    with pytest.warns(FixedShapeWarning):
        planned = plan(model, example, ranks=2, microbatches=2, repeats=1)
    first = planned.build_stage(0)
    first(torch.zeros(3, 6, dtype=torch.long))  # any rows, the captured length
    with pytest.raises(ValueError) as refused:
        first(torch.zeros(2, 7, dtype=torch.long))
    assert str(refused.value) == (
        "input 0's dimension 1 is 7, and the model was captured for 6 alone (its code depends on that size; planning "
        "said so in a FixedShapeWarning): give micro-batches of that size, or plan on an example of the size it "
        "trains on"
    )
