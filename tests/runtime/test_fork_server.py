"""The fork server's preload (:mod:`hintpipe.runtime.fork_server`): the job's signals ignored, torch and dynamo
imported once for every rank it forks, and what each rank puts back the same signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import allow
from hintpipe.runtime import rank_entry


def test_the_server_ignores_the_jobs_signals_and_preloads_what_every_rank_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    monkeypatch.delitem(sys.modules, "hintpipe.runtime.fork_server", raising=False)  # its module code runs again
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)
    try:
        import hintpipe.runtime.fork_server as server

        assert server.IGNORED == (signal.SIGTERM, signal.SIGHUP)
        assert [signal.getsignal(signum) for signum in server.IGNORED] == [signal.SIG_IGN, signal.SIG_IGN]
        assert {"torch", "torch._dynamo", "hintpipe.runtime.rank_process"} <= set(sys.modules)
        # A rank forked from it handles again exactly what the server ignores (rank_entry keeps its own copy,
        # since importing the server would make the rank ignore them).
        assert rank_entry._SERVER_IGNORES == server.IGNORED
        # SIGINT: noted, not raised, until the rank's own code runs (see test_a_sigint_before_...).
        assert signal.getsignal(signal.SIGINT) is rank_entry.note_sigint_while_starting
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


#: A fork server whose preload is the runtime's, and whose every fork gets a SIGINT in multiprocessing's own
#: bootstrap (its after-fork hooks), before the rank's entry point: where a Ctrl-C to the process group can land.
_SIGINT_IN_BOOTSTRAP = """
import multiprocessing.util, os, signal
import hintpipe.runtime.fork_server

class _Hook:
    pass

HOOK = _Hook()
multiprocessing.util.register_after_fork(HOOK, lambda _: os.kill(os.getpid(), signal.SIGINT))
"""

_LAUNCH = """
import multiprocessing, signal, sys
from hintpipe.runtime.rank_entry import start_rank

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a background job ignores it)

context = multiprocessing.get_context("forkserver")
context.set_forkserver_preload(["sigint_in_bootstrap"])
rank = context.Process(target=start_rank, args=(0, 1, b"", sys.argv[1], 30.0))
rank.start()
rank.join()
print(rank.exitcode)
"""


def test_a_sigint_before_the_ranks_own_code_ends_it_as_a_sigint_does(tmp_path: Path) -> None:
    # Before: multiprocessing's bootstrap raised KeyboardInterrupt, printed "Process ForkServerProcess-1:" and a
    # traceback, and the rank ended with exit status 1, a failure to the launcher; now 130, as a SIGINT's.
    (tmp_path / "sigint_in_bootstrap.py").write_text(textwrap.dedent(_SIGINT_IN_BOOTSTRAP))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{':'.join(sys.path)}"}
    done = subprocess.run(
        [sys.executable, "-c", _LAUNCH, str(tmp_path / "out")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=allow(120),
    )
    assert (done.stdout.strip(), done.stderr) == ("130", "")


#: A user's script whose launcher imports GPT-2's code (``hf``) or not; each rank says which of transformers'
#: modules it had as it imported the script again, before the script's own imports ([Note: what the fork server
#: imports] in hintpipe.runtime.launch).
_USER_SCRIPT = """
import sys

HAD = [name for name in ("transformers", "transformers.models.gpt2.modeling_gpt2") if name in sys.modules]

if sys.argv[1] == "hf":
    from transformers import GPT2LMHeadModel  # noqa: F401 (as a script that builds its model before run_ranks)

import hintpipe


def rank_main(rank: int, world: int) -> list[str]:
    return HAD


if __name__ == "__main__":
    print(hintpipe.run_ranks(rank_main, 2))
"""


@pytest.mark.parametrize("launcher", ["hf", "plain"])
def test_the_ranks_inherit_the_hugging_face_code_their_launcher_imported_and_nothing_it_did_not(
    launcher: str, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_USER_SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), launcher], cwd=tmp_path, capture_output=True, text=True, timeout=allow(120)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    inherited = ["transformers", "transformers.models.gpt2.modeling_gpt2"] if launcher == "hf" else []
    assert done.stdout.strip() == repr([inherited, inherited])
