"""Hints as CSV in torch.distributed.pipelining's compute-only format."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import allow
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import HintError
from hintpipe.schedule.hint_csv import hint_to_csv, load_hint_csv, parse_hint_csv, save_hint_csv


@pytest.mark.parametrize(("name", "v"), [("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1), ("zbv", 2)])
def test_round_trip(tmp_path: Path, name: str, v: int) -> None:
    hint = generate_hint(name, 4, 8, v)
    path = tmp_path / "hint.csv"
    save_hint_csv(hint, path)
    loaded = load_hint_csv(path)
    assert loaded.lists == hint.lists
    assert loaded.placement == hint.placement
    assert loaded.microbatches == 8


def test_split_backward_is_written_as_torch_backward_input() -> None:
    text = hint_to_csv(generate_hint("zb-h1", 2, 2))
    assert text.splitlines()[1] == "1F0,1I0,1F1,1I1,1W0,1W1"
    assert text.splitlines()[0] == "0F0,0F1,0I0,0W0,0I1,0W1"


def test_torch_dump_with_idle_slots_loads() -> None:
    # PipelineScheduleMulti._dump_csv writes None as an empty cell.
    hint = parse_hint_csv("0F0,0F1,,0B0,0B1\n,1F0,1B0,1F1,1B1\n")
    assert [str(t) for t in hint.lists[0]] == ["0F0", "0F1", "0B0", "0B1"]
    assert hint.placement.stage_rank == (0, 1)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0F0,0X0\n", r"<csv>, line 1, column 2: bad action '0X0'; expected <stage><F\|B\|I\|W><micro-batch>"),
        ("0F0,0B0\n1F0,1SEND_F0\n", r"<csv>, line 2, column 2: bad action '1SEND_F0'"),
        ("0F0,0I0,0W0,0B1\n", r"line 1, column 4: full backward 'B' mixed with split 'I'/'W' actions"),
        ("0F0,0F1\n0B0\n", r"line 2, column 1: stage 0 is on rank 0 \(line 1\) and on rank 1"),
        ("", "<csv>: no actions found"),
        ("1F0,1B0\n", r"<csv>: stages \[0\] have no actions"),
    ],
)
def test_malformed_csv_names_line_and_column(text: str, message: str) -> None:
    with pytest.raises(HintError, match=message):
        parse_hint_csv(text)


def test_missing_task_names_rank_and_task() -> None:
    with pytest.raises(HintError, match=r"rank 1, position 3: 1B1 is missing from rank 1"):
        parse_hint_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1\n")


def test_duplicate_task_is_refused() -> None:
    with pytest.raises(HintError, match=r"rank 0, position 2: 0F0 appears twice \(first at position 0\)"):
        parse_hint_csv("0F0,0B0,0F0\n1F0,1B0\n")


def test_backward_before_forward_on_one_rank_is_refused() -> None:
    with pytest.raises(
        HintError, match=r"rank 0, position 0: 0B0 comes before 0F0 at position 1: a backward needs its forward"
    ):
        parse_hint_csv("0B0,0F0\n1F0,1B0\n")


def test_cross_rank_deadlock_is_refused_with_a_dump() -> None:
    # Rank 0 waits for 0B0's gradient before sending 0F1; rank 1 wants 1F1 before 1B0... fine.
    # Here rank 1 insists on 1F1 first, which needs 0F1, which rank 0 runs only after 0B0,
    # which needs 1B0: a cycle.
    text = "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n"
    with pytest.raises(HintError) as info:
        parse_hint_csv(text)
    message = str(info.value)
    assert "cannot complete in fixed order" in message
    assert "rank 0: 3 tasks pending; next in hint 0B0 (position 1) waits for gradient of stage 1 from rank 1" in message
    assert (
        "rank 1: 4 tasks pending; next in hint 1F1 (position 0) waits for activation of stage 0 from rank 0" in message
    )


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(HintError, match="cannot read hint file"):
        load_hint_csv(tmp_path / "missing.csv")


def test_a_stage_number_far_past_the_others_is_refused_at_once_in_bounded_memory() -> None:
    """Found by the parser's fuzz test, whose worker the kernel killed at 21 GB: ``99999999F0`` (a typo's stage)
    made the parser list every stage number below it to find the ones without actions. Parsed here in a process
    of its own held to 1 GiB of address space (the schedule package imports no torch)."""
    code = (
        "from hintpipe.schedule.hint_csv import parse_hint_csv\n"
        "from hintpipe.schedule.hint import HintError\n"
        "try:\n"
        "    parse_hint_csv('0F0,0B0\\n99999999F0,99999999B0\\n')\n"
        "except HintError as exc:\n"
        "    print(exc)\n"
    )

    def held() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=held, timeout=allow(60)
    )
    assert (done.returncode, done.stdout) == (0, "<csv>: stages 1-99999998 have no actions\n"), done.stderr
