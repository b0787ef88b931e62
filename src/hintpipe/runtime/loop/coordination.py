"""One decision per tensor-parallel group: the leader chooses, the followers run its sequence.

A stage split over a tensor-parallel (TP) group runs collectives inside every
forward and backward, so every member must run the same tasks in the same
order, or their collectives pair up across different micro-batches (wrong
results, or a hang). Under a fixed order that holds by itself. Under
readiness it does not: messages reach the members at different moments, their
ready sets differ, and independent choices diverge.

So within each TP group the member at tp coordinate 0, the *leader*, runs the
scoreboard's choice and sends each choice (step, position in the rank's task
list) to the others, the *followers*, on a gloo group of their own. A
follower's receiving thread puts each decision into the rank's inbox, next to
its pipeline messages; the step loop runs the decided task as soon as its own
inputs have arrived, and never chooses by itself. Admission needs no
agreement: the followers' memory follows the leader's sequence.

[Note: decisions in batches]
A decision that reaches a follower after its previous task ended holds the
whole group (the leader's next collective waits for it): one message's
latency and hand-over per task. But most of a leader's choices are known
before it makes them: the hint's next tasks whose inputs have arrived are
what the scoreboard will take next, whatever arrives meanwhile (see [Note:
decisions that nothing can change] in :mod:`hintpipe.dispatch.scoreboard`). So with
each choice the leader announces, in the same message, the tasks it will
certainly run after it (up to :data:`LOOKAHEAD`), and later only the ones it
has not announced yet: the followers hold their next decisions before they
need them, and one message carries several.

[Note: no coordination under fixed]
With ``fixed`` every member runs the hint's order, which is the same on every
member of the group: :func:`needed` is False, no group is created, no
decision travels, and the step loop runs as without tensor parallelism.

A follower that waits names what it waits for: the leader's next decision, or
the input of the decided task. A leader that fails (or vanishes) ends its
followers' steps with an error naming it, like a failed neighbour.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from hintpipe.dispatch.policy import Policy
from hintpipe.runtime.transport.wire import Message, MessageKind

log = logging.getLogger(__name__)

_STOP = -2  # a decision's step that tells followers the leader is done
#: The most decisions a leader announces ahead of the task it runs (see [Note: decisions in batches]).
LOOKAHEAD = 16
_WIDTH = 2 + 1 + LOOKAHEAD  # a message: step, count, then the positions


def needed(policy: Policy, tp: int) -> bool:
    """Whether the TP group's members must be told what to run (see [Note: no coordination under fixed])."""
    return tp > 1 and policy is not Policy.FIXED


class Coordination:
    """This rank's part in its TP group's decisions.

    Args:
        group: the TP group's gloo group (its ranks: the members, the leader first).
        inbox: where a follower's decisions go, beside its pipeline messages.
        leader: the leader's global rank (for error messages).
    """

    def __init__(self, group: dist.ProcessGroup, inbox: queue.SimpleQueue[Message], leader: int) -> None:
        self.group = group
        self.member = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.leader = leader
        self.is_leader = self.member == 0
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []
        self._thread: threading.Thread | None = None
        #: Seconds spent announcing decisions (leader), how many, and in how many messages.
        self.announce_seconds = 0.0
        self.decisions = 0
        self.messages = 0
        if not self.is_leader:
            self._thread = threading.Thread(target=self._receive, args=(inbox,), name="tp-decisions", daemon=True)
            self._thread.start()

    def announce(self, step: int, positions: Sequence[int]) -> None:
        """The leader's next choices in step ``step``, in the order it runs them (at most
        :data:`LOOKAHEAD` + 1): tell every follower, in one message."""
        if not 0 < len(positions) <= _WIDTH - 2:
            raise ValueError(f"{len(positions)} decisions in one message: 1 to {_WIDTH - 2}")
        began = time.perf_counter()
        padding = [-1] * (_WIDTH - 2 - len(positions))
        self._send(torch.tensor([step, len(positions), *positions, *padding], dtype=torch.int64))
        self.announce_seconds += time.perf_counter() - began
        self.decisions += len(positions)
        self.messages += 1

    def _send(self, decision: torch.Tensor) -> None:
        for follower in range(1, self.size):
            work = dist.isend(decision, group=self.group, group_dst=follower)
            if work is not None:
                self._pending.append((work, decision))
        while len(self._pending) > 64:  # gloo learns that a send finished only when waited on
            self._pending.pop(0)[0].wait()

    def _receive(self, inbox: queue.SimpleQueue[Message]) -> None:
        decision = torch.zeros(_WIDTH, dtype=torch.int64)
        try:
            while True:
                dist.recv(decision, group=self.group, group_src=0)
                step, count, *positions = decision.tolist()
                if step == _STOP:
                    return
                arrived = time.perf_counter()
                for pos in positions[:count]:
                    inbox.put(Message(MessageKind.DECISION, step, -1, pos, [], self.leader, arrived))
        except Exception as exc:  # the leader died or the group was torn down
            inbox.put(
                Message(
                    MessageKind.ABORT,
                    -1,
                    -1,
                    -1,
                    [],
                    self.leader,
                    time.perf_counter(),
                    f"the tensor-parallel leader, rank {self.leader}, stopped deciding: {exc}",
                )
            )

    def close(self, timeout: float) -> None:
        """The leader tells its followers it is done; every member waits for its sends and thread."""
        limit = datetime.timedelta(seconds=timeout)
        try:
            if self.is_leader:
                self._send(torch.tensor([_STOP] + [-1] * (_WIDTH - 1), dtype=torch.int64))
            for work, _ in self._pending:
                work.wait(limit)
        except Exception as exc:  # a follower may already be gone
            log.debug("tensor-parallel decisions did not all leave: %s", exc)
        self._pending.clear()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
