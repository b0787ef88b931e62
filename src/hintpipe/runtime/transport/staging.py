"""Host buffers for moving device tensors over gloo: the staging of the gloo transport.

gloo moves host memory. A rank computing on a GPU hands the gloo mailbox its
activations through a host buffer: device to host before the send, host to
device after the receive. Two things make that cheap, and this module holds
both:

- **Pinned buffers, reused.** A copy between the device and pinned (page-locked)
  host memory is asynchronous and runs at the bus's speed; pinning costs a
  system call per allocation, so buffers are kept and reused rather than
  allocated per message. :class:`StagingPool` keeps them by size class
  (powers of two), so that a variable-length micro-batch finds the buffer its
  predecessor left.
- **Reuse only after the transfer is over.** A buffer handed back while its
  copy or send is still in flight must not be handed out again: the next
  message would overwrite bytes not yet moved. So a buffer comes back with a
  ``done`` test (the copy's CUDA event, or the gloo send having been waited
  on) and waits in a first-in, first-out queue until it passes. Transfers of
  one stream finish in the order they were issued, so the queue is checked
  from its head and the check stops at the first unfinished transfer (a
  buffer behind it, from another stream, waits a little longer: reuse comes
  late, never early).

On a CPU rank the device *is* the host: nothing is staged and the same code
path runs with no-op copies (a received buffer is handed over to the tensors
that view it instead of coming back to the pool).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence

import torch

from hintpipe.device import EventArrival, ReceivedBytes, new_event, new_stream
from hintpipe.runtime.transport.wire import Value, tensors_of

#: The smallest buffer the pool keeps (smaller messages share this size class).
MIN_BUFFER = 4096


def size_class(nbytes: int) -> int:
    """The capacity of the buffer that holds ``nbytes``: the next power of two, at least :data:`MIN_BUFFER`."""
    if nbytes < 0:
        raise ValueError(f"a buffer cannot hold {nbytes} bytes")
    return max(MIN_BUFFER, 1 << max(0, nbytes - 1).bit_length())


class StagingPool:
    """Host buffers reused across messages (thread-safe: the mailbox threads and the sender share one).

    Args:
        pin: whether buffers are pinned (on a CUDA rank; pinning needs CUDA).
        rounded: whether buffers are kept by size class (default: when pinned);
            a CPU rank's are exactly the size asked for, as they are usually
            handed over to the tensors received into them.
        keep_bytes: the most bytes of free buffers kept for reuse; a buffer given
            back beyond that is released (a burst of large messages must not pin
            host memory for the rest of the run).
    """

    def __init__(self, *, pin: bool, rounded: bool | None = None, keep_bytes: int = 1 << 28) -> None:
        self.pin = pin
        self.rounded = pin if rounded is None else rounded
        self.keep_bytes = keep_bytes
        self._free: dict[int, list[torch.Tensor]] = collections.defaultdict(list)
        self._free_bytes = 0
        self._in_flight: collections.deque[tuple[torch.Tensor, Callable[[], bool]]] = collections.deque()
        self._lock = threading.Lock()
        #: Buffers allocated so far (a measure of reuse: steady traffic stops allocating).
        self.allocated = 0

    def take(self, nbytes: int) -> torch.Tensor:
        """A ``uint8`` host buffer of ``nbytes`` bytes (a view of a buffer of its size class)."""
        capacity = size_class(nbytes) if self.rounded else nbytes
        with self._lock:
            self._recycle()
            free = self._free[capacity]
            if free:
                buffer = free.pop()
                self._free_bytes -= capacity
                return buffer[:nbytes]
            self.allocated += 1
        return torch.empty(capacity, dtype=torch.uint8, pin_memory=self.pin)[:nbytes]

    def give_back(self, buffer: torch.Tensor, done: Callable[[], bool] | None = None) -> None:
        """Return ``buffer`` (from :meth:`take`); it is reused once ``done()`` is true (at once without ``done``).

        Buffers with a ``done`` test must be given back in the order their transfers were issued.
        """
        with self._lock:
            self._in_flight.append((buffer, done if done is not None else _finished))
            self._recycle()

    @property
    def in_flight(self) -> int:
        """Buffers given back whose transfer has not been seen to finish."""
        with self._lock:
            return len(self._in_flight)

    @property
    def free_bytes(self) -> int:
        """Bytes of buffers ready for reuse."""
        with self._lock:
            return self._free_bytes

    def _recycle(self) -> None:
        """Free the buffers at the head of the queue whose transfer finished (called under the lock)."""
        while self._in_flight and self._in_flight[0][1]():
            view, _ = self._in_flight.popleft()
            buffer = _whole(view)
            capacity = buffer.numel()
            if self._free_bytes + capacity <= self.keep_bytes:
                self._free[capacity].append(buffer)
                self._free_bytes += capacity


def _finished() -> bool:
    return True


def _whole(view: torch.Tensor) -> torch.Tensor:
    """The pool buffer a view from :meth:`StagingPool.take` was cut from."""
    storage = view.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=view.device).set_(storage, 0, (storage.nbytes(),), (1,))


class Staging:
    """The gloo transport's path between a rank's device and the wire (host memory).

    On a CUDA rank: outgoing payloads are copied into pinned buffers on a
    transfer stream of their own (after the compute that produced them), and
    the copy's event is what the sender waits on before gloo reads the buffer
    (:mod:`hintpipe.runtime.transport.sender`: on its own thread, never the
    computing one). Received payloads are copied to the device on the
    receiving thread's transfer stream, with an event the consumer waits on
    right before the task that uses them (:class:`~hintpipe.device.EventArrival`).
    On a CPU rank every step is a no-op.

    Args:
        device: the rank's device.
        received: counts the device bytes the receiving threads allocate (see [Note: what a forward left
            allocated] in :mod:`hintpipe.device`).
    """

    def __init__(self, device: torch.device, received: ReceivedBytes | None = None) -> None:
        self.device = device
        self.staged = device.type == "cuda"
        self.pool = StagingPool(pin=self.staged)
        self.received = received if received is not None else ReceivedBytes()
        self._stream: torch.cuda.Stream | None = new_stream(device) if self.staged else None
        self._streams = threading.local()  # one host-to-device stream per receiving thread

    def outgoing(
        self, payload: torch.Tensor, head: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor | None, Callable[[], None] | None]:
        """``payload`` (bytes on the device) on its way to host memory, behind ``head`` bytes left for the
        caller's header; returns the host bytes (the head's room included), the pool buffer to give back once
        the send completed (None: nothing was staged, and the host bytes are ``payload`` itself, without the
        room), and what waits for the copy to land (None: the bytes are there now). Nothing here waits: the
        compute goes on."""
        if not self.staged or not payload.is_cuda:  # (an emulated rank's stand-ins stay on the host)
            return payload, None, None
        assert self._stream is not None
        buffer = self.pool.take(head + payload.numel())
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            buffer[head:].copy_(payload, non_blocking=True)
            copied = new_event()
            copied.record(self._stream)
        payload.record_stream(self._stream)
        return buffer, buffer, copied.synchronize

    def arrived(self, tensors: Sequence[Value], buffer: torch.Tensor | None) -> tuple[list[Value], EventArrival | None]:
        """Received ``tensors`` (views of the host ``buffer`` from :attr:`pool`, or None when they are not)
        on the device; returns them and their transfer to wait for before using them (None: usable now).
        Numbers stay on the host, as they came ([Note: numbers in the header] in
        :mod:`hintpipe.runtime.transport.wire`)."""
        if not self.staged:
            if buffer is not None and not _aliases(tensors, buffer):
                self.pool.give_back(buffer)
            return list(tensors), None
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = new_stream(self.device)
        with torch.cuda.stream(stream), self.received.allocating([t.nbytes for t in tensors_of(tensors)]):
            moved = [t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in tensors]
            event = new_event()
            event.record(stream)
        if buffer is not None:
            self.pool.give_back(buffer, event.query)
        return moved, EventArrival(event)


def _aliases(tensors: Sequence[Value], buffer: torch.Tensor) -> bool:
    """Whether any of ``tensors`` views ``buffer``'s memory."""
    storage = buffer.untyped_storage().data_ptr()
    return any(t.untyped_storage().data_ptr() == storage for t in tensors_of(tensors))
