"""The first code a rank runs (:mod:`hintpipe.runtime.rank_entry`): it ties itself to its launcher, or to the
fork server's parent, or under torchrun to its agent, and ends at once where that process is gone already. The
watching thread, the kernel's parent-death signal and the exit are stood in for here."""

from __future__ import annotations

import os

import pytest

from hintpipe.runtime import launcher_env, rank_entry
from hintpipe.runtime.launcher_env import LAUNCHER_ENV, TORCHRUN_ENV


class Exited(Exception):
    """``os._exit`` as the test sees it."""


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """What the rank would watch: ``(process, through_server)`` for each tie."""
    ties: list[tuple[int, bool]] = []

    def watch(process: int, *, through_server: bool = False) -> None:
        ties.append((process, through_server))

    def exit_now(status: int) -> None:
        raise Exited(status)

    monkeypatch.setattr(rank_entry, "_watch", watch)
    monkeypatch.setattr(rank_entry, "_die_with_parent", lambda: None)
    monkeypatch.setattr(os, "_exit", exit_now)
    monkeypatch.setattr(launcher_env, "_tied_to", None)
    monkeypatch.setattr(launcher_env, "AGENT_AT_START", None)
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    monkeypatch.delenv(TORCHRUN_ENV, raising=False)
    return ties


def test_a_process_no_launcher_of_ours_started_is_tied_to_nothing(watched: list[tuple[int, bool]]) -> None:
    rank_entry.tie_to_launcher()
    rank_entry.tie_to_agent()
    assert watched == []


def test_a_spawned_rank_watches_its_parent_and_a_forked_one_its_parents_parent(
    watched: list[tuple[int, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LAUNCHER_ENV, str(os.getppid()))
    rank_entry.tie_to_launcher()
    grandparent = launcher_env.parent_of(os.getppid())
    assert grandparent is not None
    monkeypatch.setenv(LAUNCHER_ENV, str(grandparent))  # this process's parent stands for the fork server
    rank_entry.tie_to_launcher()
    assert watched == [(os.getppid(), False), (grandparent, True)]


def test_a_rank_whose_launcher_is_gone_already_ends_before_anything_runs(
    watched: list[tuple[int, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LAUNCHER_ENV, str(os.getpid()))  # neither its parent nor its parent's parent
    with pytest.raises(Exited, match=r"^1$"):
        rank_entry.tie_to_launcher()
    assert watched == []


def test_under_torchrun_a_rank_watches_the_agent_it_started_under(
    watched: list[tuple[int, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TORCHRUN_ENV, "run-1")
    monkeypatch.setattr(launcher_env, "AGENT_AT_START", os.getppid())
    rank_entry.tie_to_agent()
    assert watched == [(os.getppid(), False)]
    monkeypatch.setattr(launcher_env, "AGENT_AT_START", os.getpid())  # re-parented since: the agent is gone
    with pytest.raises(Exited, match=r"^1$"):
        rank_entry.tie_to_agent()
