"""The sender: a GPU rank's messages posted by a thread of their own, in order, each once its staging copy
has landed, and their buffers back in the pool as soon as their sends complete (see [Note: the sender
thread] in hintpipe.runtime.transport.sender). Posts and copies are stand-ins where the order and the waits
are what is tested; a CPU mailbox with the thread runs the real sends between two ranks."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist

from conftest import allow
from groups import Case, run_cases, succeeded
from hintpipe.runtime.transport.mailbox import GlooTransport
from hintpipe.runtime.transport.sender import UNREAPED, Outgoing, Sender
from hintpipe.runtime.transport.staging import MIN_BUFFER, StagingPool
from hintpipe.runtime.transport.wire import MessageKind, Value

WAIT_S = 30.0  # a bound on waiting for the thread, never reached when it works


class _Work:
    """A posted send that completes when waited on, and says so."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self.log.append(f"waited {self.name}")
        return True


class _Copy:
    """A staging copy that lands when the test says so."""

    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name
        self.landed = threading.Event()

    def wait(self) -> None:
        assert self.landed.wait(WAIT_S), f"copy {self.name} never landed"
        self.log.append(f"copied {self.name}")


def _named(value: int) -> torch.Tensor:
    return torch.tensor([value])


def _sender(log: list[str], pool: StagingPool, *, threaded: bool) -> Sender:
    def post(tensor: torch.Tensor, peer: int) -> _Work:
        name = f"{int(tensor[0])}>{peer}"
        log.append(f"posted {name}")
        return _Work(log, name)

    return Sender(post, pool, threaded=threaded)


def test_the_thread_posts_in_order_each_message_once_its_copy_landed() -> None:
    log: list[str] = []
    pool = StagingPool(pin=False, rounded=True)
    sender = _sender(log, pool, threaded=True)
    first, second = _Copy(log, "a"), _Copy(log, "b")
    sender.submit(Outgoing(1, [_named(1), _named(2)], ready=first.wait))
    sender.submit(Outgoing(2, [_named(3)], ready=second.wait))
    second.landed.set()  # the later copy lands first: its message still waits for the one before
    assert all(not entry.startswith("posted") for entry in log)  # nothing leaves before the first copy
    first.landed.set()
    sender.flush(WAIT_S)
    sender.stop(WAIT_S)
    assert log == [
        "copied a",
        "posted 1>1",
        "posted 2>1",
        "copied b",
        "posted 3>2",
        "waited 1>1",
        "waited 2>1",
        "waited 3>2",
    ]


def test_a_staged_buffer_is_back_in_the_pool_once_the_thread_is_idle() -> None:
    log: list[str] = []
    pool = StagingPool(pin=False, rounded=True)
    sender = _sender(log, pool, threaded=True)
    buffer = pool.take(100)
    idle = threading.Event()
    original = pool.give_back

    def give_back(view: torch.Tensor, done: object = None) -> None:
        original(view)
        idle.set()

    pool.give_back = give_back  # type: ignore[method-assign,assignment]
    sender.submit(Outgoing(1, [_named(1)], staged=buffer))
    # No flush and no 64 pending sends: the idle thread waited on the send and gave the buffer back.
    assert idle.wait(WAIT_S)
    assert pool.free_bytes == MIN_BUFFER and pool.in_flight == 0 and sender.pending == 0
    assert pool.take(100).data_ptr() == buffer.data_ptr()  # reused: no new pinned buffer
    assert log == ["posted 1>1", "waited 1>1"]
    sender.stop(WAIT_S)


def test_without_a_thread_sends_leave_at_once_and_are_reaped_beyond_the_bound() -> None:
    log: list[str] = []
    sender = _sender(log, StagingPool(pin=False), threaded=False)
    for i in range(UNREAPED + 1):
        sender.submit(Outgoing(1, [_named(i)]))
    # Each message is one send and its buffer's place: the oldest are waited on once more are pending.
    first_waits = UNREAPED // 2
    expected = [f"posted {i}>1" for i in range(first_waits)]
    for i in range(first_waits, UNREAPED + 1):
        expected += [f"posted {i}>1", f"waited {i - first_waits}>1"]
    assert log == expected and sender.pending == UNREAPED
    sender.flush(WAIT_S)
    assert sender.pending == 0


def test_a_send_that_fails_on_the_thread_is_raised_by_the_next_submit() -> None:
    def post(tensor: torch.Tensor, peer: int) -> None:
        raise RuntimeError("Connection closed by peer")

    sender = Sender(post, StagingPool(pin=False), threaded=True)
    sender.submit(Outgoing(1, [_named(1)]))
    with pytest.raises(RuntimeError, match=r"^a send failed: Connection closed by peer$"):
        sender.flush(WAIT_S)
    with pytest.raises(RuntimeError, match=r"^a send failed: Connection closed by peer$"):
        sender.submit(Outgoing(1, [_named(2)]))
    sender.stop(WAIT_S)


# -- a mailbox whose sends leave from the thread, between two ranks ---------------------------------------


class _ThreadedGlooTransport(GlooTransport):
    """A CPU rank's mailbox that posts its sends from the sender thread, as a GPU rank's does."""

    def _threaded_sends(self) -> bool:
        return True


def _messages() -> list[list[torch.Tensor | None]]:
    g = torch.Generator().manual_seed(3)
    return [
        [torch.randn(4, 8, generator=g)],
        [torch.randn(4, 8, generator=g)],  # the pre-posted size
        [torch.randn(2, 3, generator=g), None],  # smaller: padded
        [torch.randn(16, 8, generator=g)],  # larger: the rest follows
        [torch.randn(1, 1, generator=g) for _ in range(30)],  # a description beyond the header
        [torch.randint(0, 9, (5,), dtype=torch.int16, generator=g)],
    ]


def _threaded_mailbox(rank: int, world: int) -> list[tuple[str, int, list[Value], str | None]]:
    group = dist.new_group(backend="gloo")
    post = _ThreadedGlooTransport([1 - rank], torch.device("cpu"), group=group, notices=True)
    assert post.sender.threaded
    received: list[tuple[str, int, list[Value], str | None]] = []
    if rank == 0:
        for mb, tensors in enumerate(_messages()):
            post.notify(1, 0, 1, mb, MessageKind.ACTIVATION)
            post.send(1, MessageKind.ACTIVATION, 0, 1, mb, tensors)
        post.close(timeout=allow(30), error="rank 0: done")  # the closing word goes after every message, in order
        return received
    while not received or received[-1][0] != "ABORT":
        msg = post.get(30)
        assert msg is not None, "a message did not arrive"
        if msg.kind is not MessageKind.STARTED:
            received.append((msg.kind.name, msg.mb, msg.tensors, msg.error))
    post.close(timeout=allow(30))
    return received


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list[Any]]:
    return run_cases(2, {"threaded mailbox": Case(_threaded_mailbox)}, timeout=120)


def test_a_mailbox_with_the_sender_thread_delivers_every_message_whole_and_in_order(
    two_ranks: dict[str, list[Any]],
) -> None:
    received = succeeded(two_ranks["threaded mailbox"])[1]
    sent = _messages()
    assert [(kind, mb, error) for kind, mb, _, error in received] == [
        *(("ACTIVATION", mb, None) for mb in range(len(sent))),
        ("ABORT", -1, "rank 0: done"),
    ]
    for (_, _, got, _), expected in zip(received, sent, strict=False):
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            assert (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
