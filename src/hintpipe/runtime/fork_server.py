"""The fork server's preload: imported once, in multiprocessing's fork server, never elsewhere.

[Note: ranks forked from a server that imported torch once]
A spawned rank is a fresh interpreter that imports torch and the runtime
before it can run: 1.5-2 s of CPU each, paid again by every rank of every
launch, and a launcher's ranks import at once, so on a 2-core machine four
ranks took several seconds to start. On Linux :func:`hintpipe.runtime.launch.run_ranks`
starts its ranks from multiprocessing's fork server instead: one process,
started by the launcher the first time it launches, imports torch and the
rank's modules once (this module is its preload) and forks every rank from
then on, for every later launch of the same launcher too. A forked rank
still runs :func:`hintpipe.runtime.rank_entry.start_rank` first: it takes the
launcher's environment as it is at this launch (the server's is the one it
started with), and ties itself to the server, whose parent is the launcher
(the server ends when the launcher does; see [Note: ranks never outlive their
launcher]).

The server must not end on a signal meant for the job: a terminal's SIGHUP,
or a SIGTERM sent to the launcher's process group, reaches the server too, and
its death would kill every rank (their parent-death signal) before they save.
multiprocessing makes the server ignore SIGINT (and hands its ranks a handler
that notes one, see [Note: a SIGINT before the rank's own code] in
:mod:`hintpipe.runtime.rank_entry`); this module makes it ignore SIGTERM and
SIGHUP as well, and a rank puts their default actions back as it
starts (:func:`~hintpipe.runtime.rank_entry.start_rank`). Torch's import
starts no thread, so forking after it is safe; CUDA is not initialised here.

[Note: a rank's first optimizer imports dynamo]
torch's optimizers are wrapped by ``torch._disable_dynamo``, which imports
``torch._dynamo`` on the first call: a rank's first ``torch.optim.AdamW(...)``
spent 1.5 s of CPU (3 s on a loaded 2-core machine) importing dynamo, sympy
and FSDP's modules, every rank of every launch, though hintpipe's own code
imports none of them (tests/tree/test_layout.py's HEAVY). The server imports it
once, with torch (no thread either), and every rank it forks inherits it: a
launcher's first launch pays it once, its ranks never. A rank of ``torchrun``
or a spawned one still pays it, as before, when it builds an optimizer.
"""

from __future__ import annotations

import signal

#: The signals the server ignores and every rank it forks handles again.
IGNORED = (signal.SIGTERM, signal.SIGHUP)

for _sig in IGNORED:
    signal.signal(_sig, signal.SIG_IGN)

import torch  # noqa: E402  (what the server is for: imported once, inherited by every rank)
import torch._dynamo  # noqa: E402, F401  (see [Note: a rank's first optimizer imports dynamo])

import hintpipe.runtime.rank_process  # noqa: E402, F401
from hintpipe.runtime.rank_entry import note_sigint_while_starting  # noqa: E402

# Last, so that a SIGINT during the imports ends the server as before; the ranks it forks start with this
# handler (multiprocessing hands them the handlers it found after the preload): see [Note: a SIGINT before
# the rank's own code] in hintpipe.runtime.rank_entry.
if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    signal.signal(signal.SIGINT, note_sigint_while_starting)
