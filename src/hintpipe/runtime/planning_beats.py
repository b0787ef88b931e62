"""A rank that works before it joins the others shows that it is alive: the command line's rank 0 under ``torchrun``
plans the model (capture and profile, minutes for a large model on a CPU) before it joins.

[Note: a rank that plans before it joins]
Under ``torchrun`` every rank runs the command line and only rank 0 plans (see [Note: plan once] in
:mod:`hintpipe.cli.train_model`): the others go on to the start and wait there for rank 0, at most the run's
timeout (``--timeout``, 300 s by default), then end naming it ("rank 0 never joined the run ... stopped, killed,
or still starting"). Planning can take longer: 53 s on a 2-core CPU for a GPT-2 of 85M parameters, so a model of
a few hundred million parameters ended every other rank while rank 0 was still at work. So while it plans, rank 0
adds to a counter in the rendezvous store every :data:`BEAT` seconds (:func:`beat_on`), and a rank waiting at the
start waits on while the counter moves (:func:`beats`), up to :data:`PATIENCE` in all. A rank 0 that is stopped or
killed stops the counter and is named after one timeout more, as before; one that plans is waited for.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

#: Seconds between a planning rank's beats (the waiting ranks look once per timeout, 30 s at the least).
BEAT = 2.0
#: The longest a rank waits at the start for a rank whose beats go on (an hour): a plan that takes longer is made
#: once ahead (``hintpipe plan --save FILE``, then ``train --plan FILE``).
PATIENCE = 3600.0
#: The counter's key in the rendezvous store (under the attempt's prefix, as every key of the start).
KEY = "hintpipe/planning"


@contextlib.contextmanager
def beat_on(store: Any) -> Iterator[None]:
    """Within: add 1 to :data:`KEY` of ``store`` now and every :data:`BEAT` seconds, from a thread of its own (the
    work within holds the interpreter for seconds at a time, a capture's or a profile's)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(BEAT):
            with contextlib.suppress(Exception):  # a store gone (torchrun's agent ended) ends the run elsewhere
                store.add(KEY, 1)

    store.add(KEY, 1)
    thread = threading.Thread(target=beat, name="planning-beats", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=BEAT + 1.0)


def beats(store: Any) -> int:
    """The beats so far in ``store`` (0 where no rank beats)."""
    return int(store.add(KEY, 0))
