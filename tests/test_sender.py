"""The sender: a GPU rank's messages posted by a thread of their own, in order, each once its staging copy
has landed, and their buffers back in the pool as soon as their sends complete (see [Note: the sender
thread] in hintpipe.runtime.transport.sender). Posts and copies are stand-ins: the order and the waits are
what is tested, with no device and no process group."""

from __future__ import annotations

import datetime
import threading

import pytest
import torch

from hintpipe.runtime.transport.sender import UNREAPED, Outgoing, Sender
from hintpipe.runtime.transport.staging import MIN_BUFFER, StagingPool

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
