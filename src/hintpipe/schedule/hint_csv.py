"""Hints as CSV, in torch.distributed.pipelining's compute-only action format.

One row per rank, one cell per action: ``2F0`` (forward), ``2B0`` (full
backward), ``2I0`` (backward to the input) and ``2W0`` (weight gradient);
empty cells are idle slots and are skipped. hintpipe's ``B`` is torch's ``I``
when the hint splits weight gradients off and its ``B`` otherwise, so a file
written by ``PipelineScheduleMulti._dump_csv`` loads here and the other way
round.

This module is torch-free.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

from hintpipe.schedule.hint import Hint, HintError, Placement
from hintpipe.schedule.task import Kind, Task
from hintpipe.schedule.validation import validate_hint

_ACTION = re.compile(r"(\d+)([FBIW])(\d+)")


def hint_to_csv(hint: Hint) -> str:
    """The hint as CSV text (one row per rank)."""
    backward = "I" if hint.split_backward else "B"
    letters = {Kind.F: "F", Kind.B: backward, Kind.W: "W"}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for tasks in hint.lists:
        writer.writerow(f"{t.stage}{letters[t.kind]}{t.mb}" for t in tasks)
    return out.getvalue()


def save_hint_csv(hint: Hint, path: str | Path) -> None:
    """Write ``hint`` to ``path`` as CSV."""
    Path(path).write_text(hint_to_csv(hint))


def load_hint_csv(path: str | Path) -> Hint:
    """Read a hint from a CSV file, infer its placement, and validate it.

    Raises:
        HintError: for an unreadable file, a malformed cell (with its line and
            column), an inconsistent placement, or a hint that breaks a rule of
            :func:`~hintpipe.schedule.validation.validate_hint`.
    """
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise HintError(f"cannot read hint file {path}: {exc}") from exc
    return parse_hint_csv(text, name=str(path))


def _missing(present: list[int]) -> str:
    """The stage numbers absent below the largest of ``present`` (sorted), listed (``[1, 2]``) or, many, as the
    runs they form (``1-999998``): a file that names stage 999999 by mistake is refused at once, not after
    listing a million numbers."""
    gaps, previous = [], -1
    for stage in present:
        if stage > previous + 1:
            gaps.append((previous + 1, stage - 1))
        previous = stage
    if sum(last - first + 1 for first, last in gaps) <= 20:
        return str([s for first, last in gaps for s in range(first, last + 1)])
    return ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in gaps)


def parse_hint_csv(text: str, name: str = "<csv>") -> Hint:
    """Parse CSV text (see :func:`load_hint_csv`)."""
    rows: list[list[tuple[int, str, int, int, int]]] = []  # (stage, letter, mb, line, column)
    try:
        parsed = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise HintError(f"{name}: not valid CSV: {exc}") from None
    for line, cells in enumerate(parsed, start=1):
        actions = []
        for column, cell in enumerate(cells, start=1):
            cell = cell.strip()
            if not cell or cell == "None":
                continue
            match = _ACTION.fullmatch(cell)
            if match is None:
                raise HintError(
                    f"{name}, line {line}, column {column}: bad action {cell!r}; expected "
                    "<stage><F|B|I|W><micro-batch> such as 2F0 (communication actions are not accepted)"
                )
            actions.append((int(match.group(1)), match.group(2), int(match.group(3)), line, column))
        rows.append(actions)
    while rows and not rows[-1]:
        rows.pop()
    if not rows:
        raise HintError(f"{name}: no actions found")
    letters = {a[1] for row in rows for a in row}
    split = bool(letters & {"I", "W"})
    if split and "B" in letters:
        first = next(a for row in rows for a in row if a[1] == "B")
        raise HintError(
            f"{name}, line {first[3]}, column {first[4]}: full backward 'B' mixed with split 'I'/'W' "
            "actions; write every backward as I plus W, or none"
        )
    if "I" in letters and "W" not in letters:
        raise HintError(f"{name}: backward-input actions 'I' without any weight actions 'W'")
    kinds = {"F": Kind.F, "B": Kind.B, "I": Kind.B, "W": Kind.W}
    stage_rank: dict[int, int] = {}
    for rank, row in enumerate(rows):
        for stage, _, _, line, column in row:
            owner = stage_rank.setdefault(stage, rank)
            if owner != rank:
                raise HintError(
                    f"{name}, line {line}, column {column}: stage {stage} is on rank {owner} "
                    f"(line {owner + 1}) and on rank {rank}; a stage lives on one rank"
                )
    stages = max(stage_rank) + 1
    if stages > len(stage_rank):  # counted from the stages named, never a range of what a typo names (1000000F0)
        raise HintError(f"{name}: stages {_missing(sorted(stage_rank))} have no actions")
    idle = [rank for rank, row in enumerate(rows) if not row]
    if idle:
        raise HintError(f"{name}: ranks {idle} (lines {[r + 1 for r in idle]}) have no actions")
    placement = Placement(tuple(stage_rank[s] for s in range(stages)))
    microbatches = max(a[2] for row in rows for a in row) + 1
    hint = Hint.from_lists(
        name,
        placement,
        microbatches,
        [[Task(stage, kinds[letter], mb) for stage, letter, mb, _, _ in row] for row in rows],
    )
    validate_hint(hint)
    return hint
