"""The fork server's preload (:mod:`hintpipe.runtime.fork_server`): the job's signals ignored, torch and dynamo
imported once for every rank it forks, and what each rank puts back the same signals."""

from __future__ import annotations

import signal
import sys

import pytest

from hintpipe.runtime import rank_entry


def test_the_server_ignores_the_jobs_signals_and_preloads_what_every_rank_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    monkeypatch.delitem(sys.modules, "hintpipe.runtime.fork_server", raising=False)  # its module code runs again
    try:
        import hintpipe.runtime.fork_server as server

        assert server.IGNORED == (signal.SIGTERM, signal.SIGHUP)
        assert [signal.getsignal(signum) for signum in server.IGNORED] == [signal.SIG_IGN, signal.SIG_IGN]
        assert {"torch", "torch._dynamo", "hintpipe.runtime.rank_process"} <= set(sys.modules)
        # A rank forked from it handles again exactly what the server ignores (rank_entry keeps its own copy,
        # since importing the server would make the rank ignore them).
        assert rank_entry._SERVER_IGNORES == server.IGNORED
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
