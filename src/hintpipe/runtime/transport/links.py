"""The NCCL transport: headers over gloo, payloads device to device.

Where every rank has a GPU of its own, staging activations through host
memory (:mod:`hintpipe.runtime.transport.staging`) costs two copies and the host's
bandwidth per message; NCCL moves them GPU to GPU. NCCL cannot post a receive
for a message whose size it does not know, and a readiness runtime does not
know which message comes next nor its shapes. So the message is split:

- the **header** (kind, step, stage, micro-batch, tensor shapes and dtypes)
  goes over the gloo mailbox as before: each peer's receiving thread always
  has a receive posted for it;
- the **payload** follows as one NCCL send per tensor on the *link* from the
  sender to the receiver, as bytes (NCCL moves no ``int16``; a tensor on the
  host, an emulated rank's stand-in, goes to the device first); the receiving
  thread allocates the tensors from the header's shapes on its device and
  posts their receives as soon as the header is in, and records an event on
  its transfer stream behind them.

NCCL runs each communicator's operations on an internal stream of its own:
sends leave on it after the compute that produced them, and compute goes on.

[Note: ready when the data is there]
A message is ready for the step loop when its payload is on this rank, not
when its header is: the header leaves as soon as the sender's host posts the
send, long before the sender's GPU has computed the payload. So the
receiving thread waits for its transfer event (:func:`deliver_when_arrived`)
and only then puts the message in the inbox; readiness then sees what the
GPU has, and a task whose input is still on the wire is not started ahead of
one whose input is here. The receiving thread may wait: the next payload of
the same link cannot arrive before this one (a link's sends complete in
order), and the next header's receive is posted right after. The compute
stream waits on the event (already passed) only right before the task that
consumes the tensors (the step loop's ``use``), which also tells the
allocator that the compute stream uses memory allocated on the transfer
stream. (None of this has run on a GPU yet; on CPU ranks the links run on
gloo and a receive is complete when it returns.)

[Note: NCCL links are deadlock-free]
A rank posts its sends in whatever order readiness picks, and a neighbour may
expect another order; NCCL matches a pair's sends and receives in the order
each side posted them per communicator, and a send does not finish until its
receive is posted. Had both directions of a pair shared a communicator (and
its stream), rank A's send of an activation could sit in front of its receive
of B's gradient while B's send of that gradient sits in front of B's receive
of the activation: each waits for the other, for ever. So every *directed*
link has a communicator of its own (``dist.new_group([a, b])`` once per
direction), used by one side only to send and by the other only to receive.
On a link, the sender posts payloads in the order it sent their headers (one
thread sends), and the receiver posts receives in the order the headers came
(one thread per peer receives, and gloo delivers a peer's headers in order),
so the n-th send always meets the n-th receive and tags are not needed. A
receive is posted as soon as its header is in, whatever the receiver is
computing, so every send finishes once the receiver's thread has read the
header: no send waits on a task, and no cycle of waits can form. What can
still stop a link (a dead peer) ends the gloo header channel too, which the
mailbox reports as a lost connection.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import math
import queue
import time
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from hintpipe.device import EventArrival, ReceivedBytes, new_event, new_stream
from hintpipe.runtime.transport.mailbox import GlooTransport
from hintpipe.runtime.transport.protocol import Connection
from hintpipe.runtime.transport.sender import Outgoing
from hintpipe.runtime.transport.wire import (
    HEADER,
    Message,
    MessageKind,
    Number,
    TensorSpec,
    Value,
    decode_meta,
    encode_header,
    lost_connection,
    tensors_of,
)

#: Link sends kept before the oldest is waited on (NCCL's are dropped once complete; gloo's only when waited).
_MAX_LINK_SENDS = 64


@dataclasses.dataclass(frozen=True)
class Link:
    """One direction between this rank and a peer: its process group and the peer's rank in the world."""

    group: dist.ProcessGroup
    peer: int


class NcclTransport(GlooTransport):
    """Headers over gloo, payloads over per-direction links: the ``nccl``
    :class:`~hintpipe.runtime.transport.protocol.Transport` (built by :meth:`connect`).

    Args:
        peers: the ranks this rank exchanges messages with, as ranks of ``group``.
        device: the rank's device (payloads are received there).
        group: the gloo group of the headers.
        outgoing: per peer, the link payloads to it leave on.
        incoming: per peer, the link its payloads come in on.
        notices, received: as for :class:`~hintpipe.runtime.transport.mailbox.GlooTransport`.
    """

    def __init__(
        self,
        peers: Sequence[int],
        device: torch.device,
        group: dist.ProcessGroup | None,
        *,
        outgoing: Mapping[int, Link],
        incoming: Mapping[int, Link],
        notices: bool = False,
        received: ReceivedBytes | None = None,
    ) -> None:
        missing = sorted(set(peers) - (set(outgoing) & set(incoming)))
        if missing:
            raise ValueError(f"no link to or from peers {missing}")
        self._outgoing = dict(outgoing)
        self._incoming = dict(incoming)
        self._link_sends: collections.deque[tuple[dist.Work, torch.Tensor]] = collections.deque()
        super().__init__(peers, device, group, notices=notices, received=received)

    @classmethod
    def connect(cls, connection: Connection, backend: str = "nccl") -> NcclTransport:
        """This rank's transport over its ``connection``: every directed link of every pipeline created first
        (collectively, on ``backend``: ``"gloo"`` runs this transport's code on CPU ranks), the headers on the
        pipeline's point-to-point group."""
        c = connection
        outgoing, incoming = make_links(c.pipelines, c.stage_rank, c.global_rank, backend, c.timeout)
        return cls(
            c.peers, c.device, c.group, outgoing=outgoing, incoming=incoming, notices=c.notices, received=c.received
        )

    @staticmethod
    def refusal(device: torch.device, own_gpu: bool) -> str | None:
        """Why ranks on ``device`` cannot use NCCL (see :class:`~hintpipe.runtime.transport.protocol.TransportSpec`)."""
        if device.type != "cuda":
            return f"moves tensors between GPUs, but the ranks compute on {device.type}"
        if not own_gpu:
            return "needs a GPU per rank (NCCL refuses two ranks on one device); use gloo"
        return None

    # -- receiving ------------------------------------------------------------

    def _receive_loop(self, peer: int) -> None:
        link = self._incoming[peer]
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the current device is per thread
        stream = new_stream(self.device) if self.device.type == "cuda" else None
        try:
            while True:
                header = torch.empty(HEADER, dtype=torch.int64)
                dist.recv(header, group=self.group, group_src=peer)
                values = header.tolist()
                kind, step, stage, mb, count, _, nbytes = values[:7]
                if MessageKind(kind) in (MessageKind.STOP, MessageKind.ABORT):
                    text = self._text(peer, nbytes)
                    self.inbox.put(Message(MessageKind(kind), step, stage, mb, [], peer, time.perf_counter(), text))
                    return
                specs = decode_meta(self._meta(peer, values), count)
                tensors, ready = self._receive_payload(link, specs, stream)
                message = Message(MessageKind(kind), step, stage, mb, tensors, peer, ready=ready)
                deliver_when_arrived(self.inbox, message)
        except Exception as exc:  # the peer died or the group was torn down
            self.inbox.put(lost_connection(peer, exc))

    def _receive_payload(
        self,
        link: Link,
        specs: list[TensorSpec | Number | None],
        stream: torch.cuda.Stream | None,
    ) -> tuple[list[Value], EventArrival | None]:
        """Receive the tensors ``specs`` describes over ``link`` (its numbers came in the header); returns
        them and their arrival (None on a CPU rank, where the receive has completed)."""
        shapes = [s for s in specs if isinstance(s, tuple)]
        sizes = [math.prod(shape) * torch.empty((), dtype=dtype).element_size() for dtype, shape in shapes]
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            with self.received.allocating(sizes if stream is not None else []):
                tensors: list[Value] = [
                    torch.empty(s[1], dtype=s[0], device=self.device) if isinstance(s, tuple) else s for s in specs
                ]
            works = [dist.irecv(as_bytes(t), src=link.peer, group=link.group) for t in tensors_of(tensors) if t.numel()]
            for work in works:
                if work is not None:
                    work.wait()  # on a GPU: the transfer stream waits for NCCL's; on a CPU: the bytes are in
            if stream is None:
                return tensors, None
            event = new_event()
            event.record(stream)
        return tensors, EventArrival(event)

    def _text(self, peer: int, nbytes: int) -> str | None:
        if not nbytes:
            return None
        data = torch.empty(nbytes, dtype=torch.uint8)
        dist.recv(data, group=self.group, group_src=peer)
        return bytes(data.tolist()).decode(errors="replace").rstrip("\x00")

    # -- sending --------------------------------------------------------------

    def _threaded_sends(self) -> bool:
        return False  # headers and closing words wait for nothing; payloads leave on NCCL's own streams

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
        text = kind in (MessageKind.STOP, MessageKind.ABORT)
        nbytes = sum(t.nbytes for t in tensors_of(tensors))
        header, extra = encode_header(kind, step, stage, mb, len(tensors), meta, nbytes)
        if text:  # a closing word: its bytes follow on the header channel, never on a link
            words = [t for t in tensors_of(tensors) if t.numel()]
            self.sender.submit(Outgoing(peer, [header, *words]))
            return
        # The description first: the receiver allocates the payload from it.
        self.sender.submit(Outgoing(peer, [header] if extra is None else [header, extra]))
        link = self._outgoing[peer]
        for t in tensors_of(tensors):  # (numbers went in the header)
            if t.numel():
                payload = as_bytes(t.to(self.device))
                work = dist.isend(payload, dst=link.peer, group=link.group)
                if work is not None:
                    self._link_sends.append((work, payload))
        self._reap_links()

    def _reap_links(self) -> None:
        while self._link_sends and self._link_sends[0][0].is_completed():
            self._link_sends.popleft()
        while len(self._link_sends) > _MAX_LINK_SENDS:
            work, _ = self._link_sends.popleft()
            work.wait()

    def flush(self, timeout: float) -> None:
        """Wait until every posted send (headers and payloads) completed."""
        super().flush(timeout)
        limit = datetime.timedelta(seconds=timeout)
        while self._link_sends:
            work, _ = self._link_sends.popleft()
            work.wait(limit)


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bytes as a flat ``uint8`` tensor (contiguous; a view where it already is): what a link
    moves, whatever the dtype (NCCL has no ``int16``; bytes it moves for every dtype)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def deliver_when_arrived(inbox: queue.SimpleQueue[Message], message: Message) -> None:
    """Put ``message`` in ``inbox`` once its payload is on this rank (see [Note: ready when the data is
    there]); the time it arrived is then."""
    if message.ready is not None:
        message.ready.wait()
    message.arrived = time.perf_counter()
    inbox.put(message)


def make_links(
    pipelines: Sequence[Sequence[int]], stage_rank: Sequence[int], global_rank: int, backend: str, timeout: float
) -> tuple[dict[int, Link], dict[int, Link]]:
    """A process group per directed pair of neighbouring positions, in every pipeline (group creation is
    collective: every rank creates every link, in the same order); returns this rank's outgoing and incoming
    links, by the peer's position (see [Note: NCCL links are deadlock-free]).

    A transfer stuck on a dead peer fails after ``timeout`` (NCCL's own watchdog then ends the rank) rather
    than NCCL's default of ten minutes.
    """
    last = len(stage_rank) - 1
    pairs = sorted(
        {(stage_rank[s], stage_rank[s + d]) for s in range(last + 1) for d in (-1, 1) if 0 <= s + d <= last}
        - {(a, a) for a in range(max(stage_rank) + 1)}
    )
    outgoing: dict[int, Link] = {}
    incoming: dict[int, Link] = {}
    span = datetime.timedelta(seconds=timeout)
    for ranks in pipelines:
        for a, b in pairs:
            group = dist.new_group([ranks[a], ranks[b]], backend=backend, timeout=span)
            if ranks[a] == global_rank:
                outgoing[b] = Link(group, ranks[b])
            elif ranks[b] == global_rank:
                incoming[a] = Link(group, ranks[a])
    return outgoing, incoming
