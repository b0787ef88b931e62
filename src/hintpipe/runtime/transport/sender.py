"""Posting a rank's sends: in order, each once its bytes are there, and their buffers back once sent.

A GPU rank hands its messages to a thread of its own (:class:`Sender` with ``threaded``), which posts their
sends, so that the computing thread goes on to its next task at once: a message's bytes are a copy from the
device into a pinned buffer, queued on the transfer stream behind the compute that produced them, and waiting
for that copy on the computing thread would hold the host to the device's pace, one task ahead at most, and the
GPU would idle while Python dispatches the next task. The thread waits for the copy's event, then posts.

A CPU rank's bytes are the tensor's own, there when the task returns, and its computing thread posts them
itself (one gloo send per message, header and payload together). It could hand them to the thread too, so
that the post overlaps the next task, but the hand-over costs more than it saves: the message waits for the
thread to be woken and scheduled (on two cores shared by two ranks, a few hundred microseconds), on the
critical path of every micro-batch of a 1F1B hint. ``benchmarks/vs-torch``'s ``paired.py`` measured, step by
step in the same ranks, a producer's end to its consumer's start (a gradient to the first rank: 1.11 ms with the
thread, 0.80 ms inline, 0.40 ms in torch's ``Schedule1F1B``) and hintpipe's ``1f1b`` at 0.94x torch's with the
thread, 1.00x inline (its README has the runs). ``SEND_THREAD_ON_CPU`` in
:mod:`hintpipe.runtime.transport.mailbox` turns the thread on for a CPU rank.

[Note: the sender thread]
- **Order.** gloo matches a peer's sends and receives on one tag in the
  order they were posted, and the receiver reads header and payload (one
  message), rest, description in that order (:mod:`hintpipe.runtime.transport.mailbox`). So
  every send of the data channel goes through the one queue, closing words
  included, and the thread posts them first in, first out: a message whose
  copy is late holds back the ones behind it, never reorders them.
  Producer notices travel on a tag of their own: on a GPU rank they are
  posted at once by the calling thread (:meth:`Sender.post_now`), since a
  notice must not wait behind a copy; on a CPU rank given the thread
  (``SEND_THREAD_ON_CPU``) nothing in the queue waits, and the thread posts
  them in turn.
- **Buffers come back as soon as their sends complete.** gloo tells that a
  send completed only to whoever waits on it. Once it has posted a message,
  the thread waits on the sends of every message before it, and on all of
  them whenever its queue is empty (every peer keeps a receive posted for
  the next message, so these waits are short, and the thread has
  nothing else to do); each message's staging buffer goes back to the pool
  as its last send completes. So the pool's bound holds, instead of buffers
  piling up in torch's pinned cache behind a queue of unreaped sends.
  Without a thread the computing thread waits on the oldest sends once more
  than :data:`UNREAPED` are pending (they only keep tensors alive).
- **Failures surface on the computing thread.** A send that fails in the
  thread (a peer gone) is kept and raised by the next :meth:`Sender.submit`
  or :meth:`Sender.flush`; the receiving thread reports the lost peer too.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from hintpipe.runtime.transport.staging import StagingPool

#: Sends posted without a thread before the oldest are waited on.
UNREAPED = 64


class Work(Protocol):
    """A posted send (``torch.distributed.Work``)."""

    def wait(self, timeout: datetime.timedelta = ...) -> Any: ...


#: Posts one tensor to a peer; returns the send (None where the backend completed it at once).
Post = Callable[[torch.Tensor, int], Work | None]


@dataclasses.dataclass
class Outgoing:
    """One message's sends, as the sender posts them.

    Attributes:
        peer: the receiving rank.
        parts: the tensors to send, in order (header, payload pieces, description).
        keep: what else must stay alive until the sends complete (the parts do).
        staged: the pool buffer the payload was staged in (back to the pool once every part is sent).
        ready: waits until ``parts`` hold their bytes (the device-to-host copy's event); None: they do.
    """

    peer: int
    parts: Sequence[torch.Tensor]
    keep: Sequence[torch.Tensor] = ()
    staged: torch.Tensor | None = None
    ready: Callable[[], None] | None = None


@dataclasses.dataclass
class _Pending:
    work: Work | None
    keep: Sequence[torch.Tensor]
    staged: torch.Tensor | None = None


@dataclasses.dataclass
class _Notice:
    """A send outside the data channel's order, queued where nothing in the queue waits for a copy."""

    tensor: torch.Tensor
    keep: Sequence[torch.Tensor]
    send: Callable[[], Work | None]


class _Flush:
    """A marker in the queue: everything before it is posted and completed once :attr:`done` is set."""

    def __init__(self, timeout: datetime.timedelta) -> None:
        self.timeout = timeout
        self.done = threading.Event()


class Sender:
    """Posts messages in the order they are submitted (see [Note: the sender thread]).

    Args:
        post: posts one tensor to a peer on the data channel.
        pool: where staged buffers go back.
        threaded: post from a thread of its own, each message once its ``ready`` returned (a GPU rank's);
            else from the calling thread, at once.
        name: the thread's name.
    """

    def __init__(
        self, post: Post, pool: StagingPool, *, threaded: bool, notices_queued: bool = False, name: str = "sender"
    ) -> None:
        self._post = post
        self._notices_queued = threaded and notices_queued
        self.pool = pool
        self._pending: collections.deque[_Pending] = collections.deque()
        self._lock = threading.Lock()  # the pending sends: the thread's and the notices the caller posts
        self._failure: BaseException | None = None
        self._queue: queue.SimpleQueue[Outgoing | _Notice | _Flush | None] | None = None
        self._thread: threading.Thread | None = None
        if threaded:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def submit(self, message: Outgoing) -> None:
        """Post ``message``'s sends (now, or on the thread once its bytes are there), after every message
        submitted before it.

        Raises:
            RuntimeError: a send of an earlier message failed on the thread.
        """
        self._raise_failure()
        if self._queue is None:
            if message.ready is not None:
                message.ready()
            self._post_all(message)
            self._reap(UNREAPED)
        else:
            self._queue.put(message)

    def post_now(self, tensor: torch.Tensor, keep: Sequence[torch.Tensor], send: Callable[[], Work | None]) -> None:
        """Post a send outside the data channel's order (a notice on its own tag): ``send()`` posts it; ``tensor``
        and ``keep`` stay alive until it completed. From the calling thread, unless ``notices_queued`` (a thread
        whose queue never waits for a copy: it posts the notice as promptly, and the calling thread does not)."""
        if self._notices_queued and self._queue is not None:
            self._queue.put(_Notice(tensor, keep, send))
            return
        work = send()
        if work is not None:
            with self._lock:
                self._pending.append(_Pending(work, [tensor, *keep]))
        if self._queue is None:
            self._reap(UNREAPED)

    def flush(self, timeout: float) -> None:
        """Wait until every message submitted so far is posted and every send completed (each send
        waited on for at most ``timeout`` seconds).

        Raises:
            RuntimeError: a send failed, or did not complete in time.
        """
        limit = datetime.timedelta(seconds=timeout)
        if self._queue is not None:
            marker = _Flush(limit)
            self._queue.put(marker)
            if not marker.done.wait(timeout + 5.0):
                raise RuntimeError(f"the sends did not complete within {timeout:g} s")
        else:
            self._reap(0, limit)
        self._raise_failure()

    def stop(self, timeout: float) -> None:
        """Stop the thread once what was submitted is posted (nothing more is submitted after)."""
        if self._queue is not None and self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)

    @property
    def pending(self) -> int:
        """Sends posted whose completion has not been waited for."""
        with self._lock:
            return len(self._pending)

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            if self._queue.empty():  # idle: wait for the posted sends, and their buffers come back
                self._reap_quietly(0, None)
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, _Flush):
                self._reap_quietly(0, item.timeout)
                item.done.set()
                continue
            if self._failure is not None:
                continue  # a peer is gone: what follows cannot go either
            if isinstance(item, _Notice):
                self._post_notice(item)
                continue
            try:
                if item.ready is not None:
                    item.ready()
                self._post_all(item)
            except Exception as exc:
                self._failure = exc
                continue
            self._reap_quietly(len(item.parts) + 1, None)  # the messages before this one

    def _post_notice(self, notice: _Notice) -> None:
        try:
            work = notice.send()
        except Exception as exc:
            self._failure = exc
            return
        if work is not None:
            with self._lock:
                self._pending.append(_Pending(work, [notice.tensor, *notice.keep]))

    def _reap_quietly(self, keep: int, timeout: datetime.timedelta | None) -> None:
        try:
            self._reap(keep, timeout)
        except Exception as exc:
            self._failure = exc

    # -- both ----------------------------------------------------------------------------------------

    def _post_all(self, message: Outgoing) -> None:
        keep = [*message.parts, *message.keep]
        posted = [_Pending(self._post(part, message.peer), keep) for part in message.parts]
        # The buffer goes back with the message's last send: sends to a peer complete in order.
        posted.append(_Pending(None, (), message.staged))
        with self._lock:
            self._pending.extend(posted)

    def _reap(self, keep: int, timeout: datetime.timedelta | None = None) -> None:
        """Wait for the oldest sends until at most ``keep`` are pending; their staging buffers go back."""
        while True:
            with self._lock:
                if len(self._pending) <= keep:
                    return
                pending = self._pending.popleft()
            if pending.work is not None:
                pending.work.wait() if timeout is None else pending.work.wait(timeout)
            if pending.staged is not None:
                self.pool.give_back(pending.staged)

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"a send failed: {self._failure}") from self._failure
