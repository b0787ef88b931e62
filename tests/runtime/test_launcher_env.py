"""What a launcher leaves in its ranks' environment (:mod:`hintpipe.runtime.launcher_env`): the process a rank is
tied to, whether it has gone, and what /proc says of a process."""

from __future__ import annotations

import os

import pytest

from hintpipe.runtime import launcher_env
from hintpipe.runtime.launcher_env import is_torchrun, orphaned, parent_of, stat_fields, tie, tied


@pytest.fixture(autouse=True)
def _untied(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process untied, as it was, after each test (tie() sets the module's state)."""
    monkeypatch.setattr(launcher_env, "_tied_to", None)
    monkeypatch.setattr(launcher_env, "_through_server", False)
    monkeypatch.setattr(launcher_env, "AGENT_AT_START", None)


def test_a_rank_tied_to_its_parent_is_orphaned_when_its_parent_is_another() -> None:
    assert not tied() and not orphaned()  # tied to nothing, started by no agent
    tie(os.getppid())
    assert tied() and not orphaned()
    tie(os.getpid())  # stands for a launcher that is no longer this process's parent
    assert orphaned()


def test_a_rank_forked_by_the_server_is_tied_through_its_parent() -> None:
    grandparent = parent_of(os.getppid())
    assert grandparent is not None
    tie(grandparent, through_server=True)
    assert not orphaned()
    tie(os.getppid(), through_server=True)
    assert orphaned()


def test_under_torchrun_an_untied_rank_watches_the_agent_it_started_under(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher_env, "AGENT_AT_START", os.getppid())
    assert not orphaned()
    monkeypatch.setattr(launcher_env, "AGENT_AT_START", os.getpid())
    assert orphaned()


def test_proc_is_read_for_a_processs_parent_and_command() -> None:
    fields = stat_fields(os.getpid())
    assert fields is not None and fields[0] == "R" and int(fields[1]) == os.getppid()
    assert parent_of(os.getpid()) == os.getppid()
    assert stat_fields(2**22 + 1) is None and parent_of(2**22 + 1) is None  # past any pid there is
    assert not is_torchrun(os.getpid()) and not is_torchrun(2**22 + 1)
