"""Message-driven communication between neighbouring ranks.

Why not torch.distributed.pipelining's P2P ops: its schedules post a receive
for the exact tensor they expect next, with shapes fixed after the first step.
A readiness runtime does not know which message comes next, and shapes change
every micro-batch. So each peer gets a *mailbox*: a thread that always has a
receive posted for the next message *header*, then posts the payload receives
the header describes and hands the finished message to the rank's inbox.

Per peer, messages arrive in the order they were sent (one receiving thread,
one tag), so no backend-specific tags are needed. Sends are asynchronous;
their buffers are held until the backend reports them complete. When nothing
is ready, the rank blocks on its inbox (a ``queue.SimpleQueue``), not in a busy loop.

The wire format is in :mod:`hintpipe.runtime.transport.wire`. gloo moves host memory:
on a GPU rank, payloads are staged through pinned host buffers
(:mod:`hintpipe.runtime.transport.staging`), which works whatever the fabric and with
one GPU shared by several ranks; :mod:`hintpipe.runtime.transport.links` moves payloads
device to device with NCCL instead.

[Note: pre-posted payloads]
gloo transfers a message only once the receiver has posted its receive; a
send that finds none waits for the receiver's "ready" notice, which the
*sender's* communication thread must then act on. On a busy host that thread
waits for a core while the sender computes its next task, and every message
paid that wait (milliseconds on two shared cores). So each mailbox keeps one
receive posted for the next message: a buffer of :data:`HEAD` bytes for its
header, then ``capacity`` bytes for its payload, the largest payload this
peer has sent so far. The sender sends header and payload as that one
message: one gloo send and one wake-up of each side's communication thread
per message, where a header and a payload of their own cost two of each
(gloo's thread spends hundreds of microseconds of CPU per message in its
event loop on a busy host). gloo delivers a message smaller than the receive
posted for it into the buffer's first bytes, so a payload that fits travels
whole behind its header (a payload of no bytes sends the header alone). On a
CPU rank that costs one copy of the payload behind the header, made by the
thread that posts the send (a GPU rank stages the payload there, after the
header, with the copy it makes anyway). Only a payload larger than ``capacity`` sends its
first ``capacity`` bytes with the header, then the rest as a message of its
own (which waits for its receive), and both sides raise ``capacity`` by the
same rule, so the sender always knows what is posted. The receiver copies a
payload smaller than its buffer out of it (the tensors it delivers hold only
their own bytes; the buffer is posted again). Variable shapes therefore cost
what their own bytes cost: nothing is padded to the largest shape seen.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from hintpipe.device import ReceivedBytes
from hintpipe.runtime.transport.protocol import Connection
from hintpipe.runtime.transport.sender import Outgoing, Sender
from hintpipe.runtime.transport.staging import Staging
from hintpipe.runtime.transport.wire import (
    HEADER,
    INLINE,
    Message,
    MessageKind,
    Value,
    decode_meta,
    encode_meta,
    header_fields,
    lost_connection,
    pack,
    unpack,
    write_header,
)

log = logging.getLogger(__name__)

#: The gloo tag of producer notices (and of the requests for them), and their fields: (kind, step, stage, mb, the
#: kind of data on its way).
_NOTICE_TAG = 1
_NOTICE_FIELDS = 5
#: Whether a CPU rank posts its sends from a thread of its own too, as a GPU rank does (off: the hand-over to the
#: thread costs a message more than posting it inline; see :mod:`hintpipe.runtime.transport.sender`).
SEND_THREAD_ON_CPU = False
#: The bytes of a message's header, in front of its payload in the one send (see [Note: pre-posted payloads]).
HEAD = HEADER * 8


class GlooTransport:
    """All mailboxes of one rank, plus its outgoing sends: the ``gloo``
    :class:`~hintpipe.runtime.transport.protocol.Transport` (built by :meth:`connect`).

    Args:
        peers: the ranks this rank exchanges messages with, as ranks of ``group``.
        device: the rank's device: received tensors are placed there; a GPU's
            tensors travel through pinned host buffers (:mod:`hintpipe.runtime.transport.staging`).
        group: the process group (default: the world); a pipeline's own group
            makes its positions the peers' names.
        notices: whether producer notices travel (a second receiving thread per
            peer, on their own tag: see [Note: producer notices] in
            :mod:`hintpipe.runtime.transport.protocol`).
        received: counts the device bytes the receiving threads allocate (see [Note: what a forward left
            allocated] in :mod:`hintpipe.device`).
    """

    def __init__(
        self,
        peers: Sequence[int],
        device: torch.device,
        group: dist.ProcessGroup | None = None,
        *,
        notices: bool = False,
        received: ReceivedBytes | None = None,
    ) -> None:
        self.rank = dist.get_rank(group)
        self.device = device
        self.group = group
        #: gloo moves host memory: a GPU rank's tensors are staged through pinned buffers.
        self.staging = Staging(device, received)
        self.received = self.staging.received
        #: A ``SimpleQueue``: a put and a blocking get cost a third less CPU than ``queue.Queue``'s (no lock and
        #: condition in Python), once or twice a task on the computing thread and each receiving thread.
        self.inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        #: Posts the data channel's sends in order (on a thread of its own where they wait for a staging copy).
        self.sender = Sender(
            self._post_data,
            self.staging.pool,
            threaded=self._threaded_sends(),
            notices_queued=not self.staging.staged,
            name="sender",
        )
        self._capacity: dict[int, int] = {}  # per peer, see [Note: pre-posted payloads]
        self._threads = []
        self.peers = sorted(set(peers) - {self.rank})
        for peer in self.peers:
            thread = threading.Thread(target=self._receive_loop, args=(peer,), name=f"mailbox-{peer}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self.notices = notices
        if notices:
            for peer in self.peers:
                thread = threading.Thread(target=self._notice_loop, args=(peer,), name=f"notices-{peer}", daemon=True)
                thread.start()
                self._threads.append(thread)

    @classmethod
    def connect(cls, connection: Connection) -> GlooTransport:
        """This rank's mailboxes to its ``connection``'s peers, on its pipeline's point-to-point group."""
        return cls(
            connection.peers,
            connection.device,
            group=connection.group,
            notices=connection.notices,
            received=connection.received,
        )

    # -- receiving ------------------------------------------------------------

    def _receive_loop(self, peer: int) -> None:
        capacity = 0  # bytes posted for the next payload (see [Note: pre-posted payloads])
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is per thread
        try:
            first, posted = self._arm(peer, capacity)
            while True:
                if posted is not None:
                    posted.wait()
                values = first[:HEAD].view(torch.int64).tolist()
                kind, step, stage, mb, count, _, nbytes = values[:7]
                payload, posted_buffer = self._payload(peer, first, capacity, nbytes)
                meta = self._meta(peer, values)
                if MessageKind(kind) in (MessageKind.STOP, MessageKind.ABORT):
                    text = bytes(payload.tolist()).decode(errors="replace").rstrip("\x00") if nbytes else None
                    self.inbox.put(Message(MessageKind(kind), step, stage, mb, [], peer, time.perf_counter(), text))
                    return
                tensors, ready = self.staging.arrived(unpack(payload, decode_meta(meta, count)), posted_buffer)
                capacity = max(capacity, nbytes)
                first, posted = self._arm(peer, capacity)  # before delivering: the next may be on its way
                arrived = time.perf_counter()
                self.inbox.put(Message(MessageKind(kind), step, stage, mb, tensors, peer, arrived, ready=ready))
        except Exception as exc:  # the peer died or the group was torn down
            self.inbox.put(lost_connection(peer, exc))

    def _payload(
        self, peer: int, first: torch.Tensor, capacity: int, nbytes: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The payload of ``nbytes`` that came into the posted buffer ``first``, behind its header, in its
        ``capacity`` bytes (its first ``capacity`` bytes, when larger); returns it and ``first`` when the payload
        views it (None: the payload is a copy, and ``first`` went back to the pool, or was dropped where it would
        never be posted again)."""
        body = first[HEAD:]
        if nbytes > capacity:
            rest = torch.empty(nbytes - capacity, dtype=torch.uint8)
            dist.recv(rest, group=self.group, group_src=peer)
            whole = torch.cat([body, rest]) if capacity else rest
            if capacity and self.staging.staged:  # (a CPU rank's pool keeps exact sizes: capacity grows past it)
                self.staging.pool.give_back(first)  # once copied out: another thread may take it at once
            return whole, None
        if nbytes < capacity and not self.staging.staged:
            payload = body[:nbytes].clone()  # views would keep the whole posted buffer alive
            self.staging.pool.give_back(first)  # and the next message's receive reuses it
            return payload, None
        return body[:nbytes], (first if capacity else None)  # (nothing posted: not the pool's)

    def _meta(self, peer: int, header: list[int]) -> list[int]:
        """The tensor description of the message whose header ``header`` came from ``peer``: in the header,
        or received after it when too long to fit."""
        meta_len = header[5]
        if meta_len <= INLINE:
            return header[7 : 7 + meta_len]
        extra = torch.empty(meta_len, dtype=torch.int64)
        dist.recv(extra, group=self.group, group_src=peer)
        meta: list[int] = extra.tolist()
        return meta

    def _notice_loop(self, peer: int) -> None:
        notice = torch.empty(_NOTICE_FIELDS, dtype=torch.int64)
        try:
            while True:
                dist.recv(notice, group=self.group, group_src=peer, tag=_NOTICE_TAG)
                kind, step, stage, mb, of = notice.tolist()
                if kind not in (MessageKind.STARTED, MessageKind.WANTED):
                    return  # the peer's close: no more notices
                arrived = time.perf_counter()
                self.inbox.put(Message(MessageKind(kind), step, stage, mb, [], peer, arrived, of=MessageKind(of)))
        except Exception as exc:  # the data channel reports a lost peer; notices only stop
            log.debug("notices from rank %d ended: %s", peer, exc)

    def _arm(self, peer: int, capacity: int) -> tuple[torch.Tensor, dist.Work | None]:
        """Post the receive of the next message from ``peer``: its header, then its payload (or the payload's
        first ``capacity`` bytes), into one buffer (see [Note: pre-posted payloads])."""
        # Nothing posted yet (a peer's first message): no pool buffer, which no payload would give back.
        first = self.staging.pool.take(HEAD + capacity) if capacity else torch.empty(HEAD, dtype=torch.uint8)
        return first, dist.irecv(first, group=self.group, group_src=peer)

    def get(self, timeout: float | None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds; ``None`` if none came."""
        try:
            return self.inbox.get(timeout=timeout) if timeout is None or timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            return None

    # -- sending --------------------------------------------------------------

    def send(self, peer: int, kind: MessageKind, step: int, stage: int, mb: int, tensors: Sequence[Value]) -> None:
        """Post a message to ``peer`` without waiting for it to leave (numbers in its header: [Note: numbers in
        the header] in :mod:`hintpipe.runtime.transport.wire`)."""
        meta = encode_meta(tensors)
        self._send(
            peer, kind, step, stage, mb, meta, [t.detach() if isinstance(t, torch.Tensor) else t for t in tensors]
        )

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        """Post a producer notice to ``peer`` (see [Note: producer notices] in
        :mod:`hintpipe.runtime.transport.protocol`)."""
        self._post_notice(peer, [int(MessageKind.STARTED), step, stage, mb, int(of)])

    def ask(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        """Ask ``peer`` for notices of the task producing the input of ``(stage, mb)`` (see [Note: notices asked
        for] in :mod:`hintpipe.runtime.transport.protocol`)."""
        self._post_notice(peer, [int(MessageKind.WANTED), step, stage, mb, int(of)])

    def _post_notice(self, peer: int, fields: list[int]) -> None:
        buffer = bytearray(8 * _NOTICE_FIELDS)
        write_header(fields, buffer)  # (a tenth of torch.tensor's cost, on the computing thread)
        notice = torch.frombuffer(buffer, dtype=torch.int64)
        self.sender.post_now(notice, [], lambda: dist.isend(notice, group=self.group, group_dst=peer, tag=_NOTICE_TAG))

    def _threaded_sends(self) -> bool:
        """Whether sends wait for a staging copy, and so are posted by a thread of their own (see [Note: the
        sender thread] in :mod:`hintpipe.runtime.transport.sender`)."""
        return self.staging.staged or SEND_THREAD_ON_CPU

    def _send(
        self,
        peer: int,
        kind: MessageKind,
        step: int,
        stage: int,
        mb: int,
        meta: list[int],
        tensors: Sequence[Value],
    ) -> None:
        capacity = self._capacity.get(peer, 0)
        if len(tensors) == 1 and isinstance(t := tensors[0], torch.Tensor) and t.is_contiguous():
            # The common case, one tensor: its own bytes (copied behind the header, or staged there).
            payload, nbytes = t.reshape(-1).view(torch.uint8), t.nbytes
        else:
            payload, nbytes = pack(tensors, self.device)
        values, extra = header_fields(kind, step, stage, mb, len(tensors), meta, nbytes)
        first = min(nbytes, capacity)  # the payload's bytes that travel with the header
        host, staged, ready = self.staging.outgoing(payload, head=HEAD)
        if staged is not None:  # staged behind the header's room: the header goes in front, no copy more
            header = bytearray(HEAD)
            write_header(values, header)
            host[:HEAD].copy_(torch.frombuffer(header, dtype=torch.uint8))
            message, rest = host[: HEAD + first], host[HEAD + first : HEAD + nbytes]
        else:
            whole = bytearray(HEAD + first)
            write_header(values, whole)
            message, rest = torch.frombuffer(whole, dtype=torch.uint8), payload[first:nbytes]
            if first:
                ready = _copier(message[HEAD:], payload[:first])  # on the sender thread, where there is one
        parts = [message]
        if nbytes > capacity:
            parts.append(rest)
        if extra is not None:
            parts.append(extra)
        self.sender.submit(Outgoing(peer, parts, keep=[payload], staged=staged, ready=ready))
        self._capacity[peer] = max(capacity, nbytes)

    def _send_text(self, peer: int, kind: MessageKind, text: str) -> None:
        data = torch.tensor(list(text.encode()[:4000]), dtype=torch.uint8)
        self._send(peer, kind, -1, -1, -1, encode_meta([data]), [data])

    def _post_data(self, tensor: torch.Tensor, peer: int) -> dist.Work | None:
        return dist.isend(tensor, group=self.group, group_dst=peer)

    def flush(self, timeout: float) -> None:
        """Wait until every posted send completed (at most ``timeout`` seconds each)."""
        self.sender.flush(timeout)

    # -- shutdown ---------------------------------------------------------------

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        """Tell every peer we are done (or failed, with ``error``) and stop the mailboxes."""
        for peer in self.peers:
            try:
                if error is None:
                    self._send_text(peer, MessageKind.STOP, "")
                else:
                    self._send_text(peer, MessageKind.ABORT, error)
                if self.notices:
                    self._post_notice(peer, [int(MessageKind.STOP), -1, -1, -1, -1])
            except Exception as exc:  # the peer may already be gone
                log.debug("could not notify rank %d: %s", peer, exc)
        try:
            self.flush(timeout)
        except Exception as exc:
            log.debug("sends did not complete: %s", exc)
        self.sender.stop(timeout)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _copier(to: torch.Tensor, source: torch.Tensor) -> Callable[[], None]:
    """What copies a payload's bytes behind its header, once the sender posts it (see [Note: pre-posted
    payloads])."""

    def copy() -> None:
        to.copy_(source)

    return copy
