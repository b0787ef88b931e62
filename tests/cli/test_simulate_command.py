"""``hintpipe simulate`` (:mod:`hintpipe.cli.simulate`): its JSON, its policies compared on the same samples, and
its refusals in one line."""

from __future__ import annotations

import json

import pytest

from hintpipe.cli import main, simulate


def test_the_policies_are_compared_on_the_same_step_in_one_json_object(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--ranks", "2", "--microbatches", "4", "--hint", "1f1b", "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # Uniform costs: every policy runs 1F1B's own order, (m + p - 1)(F + B) = 15 against a busiest rank's 12.
    assert {p: (out[p]["makespan_cost"], out[p]["lower_bound_cost"]) for p in ("fixed", "greedy", "ready")} == {
        p: (15.0, 12.0) for p in ("fixed", "greedy", "ready")
    }
    assert (out["speedup"], out["speedup_greedy"], out["hint"], out["stages"]) == (1.0, 1.0, "1f1b", 2)
    assert out["fixed"]["peak_live_slots"] == [2.0, 1.0]


def test_no_trial_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--ranks", "2", "--microbatches", "4", "--trials", "0"]) == 2
    assert capsys.readouterr().err == "hintpipe simulate: error: --trials must be at least 1, got 0\n"


def test_a_simulation_too_large_for_memory_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def no_memory(args: object) -> int:
        raise MemoryError

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulate, "run", no_memory)
        assert main(["simulate", "--ranks", "20000", "--microbatches", "20000"]) == 2
    assert capsys.readouterr().err == (
        "hintpipe simulate: error: --ranks 20000 --microbatches 20000 does not fit in this process's memory; use "
        "fewer ranks or micro-batches\n"
    )
