"""[Note: a rank that plans before it joins]: a planning rank beats in the rendezvous store, and a rank waiting at
the start waits on while the beats move, and names the rank once they stop."""

from __future__ import annotations

import datetime
import re
import threading
import time

import pytest
from torch._C._distributed_c10d import HashStore

from hintpipe.runtime import planning_beats
from hintpipe.runtime.errors import PeerFailure
from hintpipe.runtime.rank_process import gather_over_store


def _store(seconds: float) -> HashStore:
    store = HashStore()
    store.set_timeout(datetime.timedelta(seconds=seconds))
    return store


def test_a_planning_rank_beats_while_it_plans_and_not_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planning_beats, "BEAT", 0.02)
    store = _store(1.0)
    assert planning_beats.beats(store) == 0  # no rank beats
    with planning_beats.beat_on(store):
        assert planning_beats.beats(store) >= 1  # at once, before the first interval
        time.sleep(0.5)
    after = planning_beats.beats(store)
    assert after >= 3
    time.sleep(0.2)
    assert planning_beats.beats(store) == after  # the thread ended with the block


def test_the_start_waits_on_for_a_rank_that_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 1 plans for 4 of rank 0's timeouts, beating, then joins: rank 0 waits on and gathers both. (Timeouts of
    # 0.5 s, 25 beats each: a loaded machine may hold the beating thread back, not for a whole timeout.)
    monkeypatch.setattr(planning_beats, "BEAT", 0.02)
    store = _store(0.5)

    def plan_then_join() -> None:
        with planning_beats.beat_on(store):
            time.sleep(2.0)
        store.set("hintpipe/gpu/1", "node-b/GPU-0")

    rank_1 = threading.Thread(target=plan_then_join)
    rank_1.start()
    try:
        assert gather_over_store(store, 0, 2, "hintpipe/gpu", "node-a/GPU-0") == ["node-a/GPU-0", "node-b/GPU-0"]
    finally:
        rank_1.join()


def test_a_rank_whose_beats_stop_is_named_a_timeout_later(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 1 beats for 1.2 s, then stops (stopped or killed while it plans) and never joins: rank 0 waits on while
    # the beats move, and names it once a whole timeout passed without one.
    monkeypatch.setattr(planning_beats, "BEAT", 0.02)
    store = _store(0.5)

    def plan_then_stop() -> None:
        with planning_beats.beat_on(store):
            time.sleep(1.2)

    rank_1 = threading.Thread(target=plan_then_stop)
    rank_1.start()
    try:
        with pytest.raises(PeerFailure) as never:
            gather_over_store(store, 0, 2, "hintpipe/gpu", "")
    finally:
        rank_1.join()
    said = re.fullmatch(
        r"rank 0: rank 1 never joined the run \(waited ([\d.]+) s for it at the start: stopped, killed, or still "
        r"starting\)",
        str(never.value),
    )
    assert said is not None, str(never.value)
    assert float(said.group(1)) >= 1.5  # past the beats' 1.2 s, in whole timeouts of 0.5 s


def test_without_beats_the_start_waits_one_timeout() -> None:
    store = _store(0.2)
    with pytest.raises(PeerFailure, match=r"^rank 0: rank 1 never joined the run \(waited 0.2 s for it at the start"):
        gather_over_store(store, 0, 2, "hintpipe/gpu", "")
