"""The mailbox wire protocol between two ranks: every message arrives whole,
in order, whatever its shapes, dtypes and size relative to the pre-posted
payload (see [Note: pre-posted payloads] in hintpipe.runtime.transport.mailbox),
and the numbers it carries come back as the Python numbers sent ([Note: numbers
in the header] in hintpipe.runtime.transport.wire)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conftest import allow
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.transport.mailbox import GlooTransport
from hintpipe.runtime.transport.wire import HEADER, Message, MessageKind, Value, lost_connection, what_the_peer_said

HEAD = HEADER * 8  # a header's bytes


def _messages() -> list[list[Value]]:
    g = torch.Generator().manual_seed(0)
    return [
        [torch.randn(4, 8, generator=g)],  # the first: nothing pre-posted yet
        [torch.randn(4, 8, generator=g)],  # the same size: the pre-posted receive takes it whole
        [torch.randn(2, 3, generator=g)],  # smaller: into the pre-posted receive, its own bytes only
        [torch.empty(0)],  # no bytes: the header alone meets the pre-posted receive
        [torch.randn(16, 8, generator=g)],  # larger: the pre-posted part, then the rest
        [torch.randint(0, 9, (5,), generator=g), None, torch.randn(3, dtype=torch.float64, generator=g)],
        [torch.ones(3, dtype=torch.bool), torch.empty(0, 4)],  # odd byte counts and an empty tensor
        [torch.randn(1, 1, 1, generator=g) for _ in range(30)],  # a description longer than the header
        [torch.randn(40, 8, generator=g), torch.randint(0, 3, (7,), dtype=torch.int8, generator=g)],
        [torch.randn(2, 5, generator=g), 12, -(2**62), 0.1, True],  # numbers beside a tensor: in the header
        [9],  # a number alone: no payload bytes
        [torch.randn(4, 8, generator=g)],
    ]


def _mailbox_worker(rank: int, world: int) -> list[tuple[int, int, list[Value]]] | None:
    group = dist.new_group(backend="gloo")
    post = GlooTransport([1 - rank], torch.device("cpu"), group=group)
    received = None
    if rank == 0:
        for mb, tensors in enumerate(_messages()):
            post.send(1, MessageKind.ACTIVATION, 0, 1, mb, tensors)
    else:
        received = []
        for _ in _messages():
            msg = post.get(30)
            assert msg is not None, "a message did not arrive"
            received.append((int(msg.kind), msg.mb, msg.tensors))
    post.close(timeout=allow(30))
    return received


def test_every_message_arrives_whole_and_in_order() -> None:
    received = run_ranks(_mailbox_worker, 2, timeout=60)[1]
    sent = _messages()
    assert [mb for _, mb, _ in received] == list(range(len(sent)))
    assert all(kind == MessageKind.ACTIVATION for kind, _, _ in received)
    for (_, mb, got), expected in zip(received, sent, strict=True):
        assert len(got) == len(expected), mb
        for a, b in zip(got, expected, strict=True):
            if isinstance(b, torch.Tensor):
                assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, mb
                assert torch.equal(a, b), mb
            else:  # None, or a number: the same value of the same type
                assert (type(a), a) == (type(b), b), mb


def _notice_worker(rank: int, world: int) -> tuple[list[tuple[int, int, int]], list[int], bool] | None:
    group = dist.new_group(backend="gloo")
    post = GlooTransport([1 - rank], torch.device("cpu"), group=group, notices=True)
    result = None
    if rank == 0:
        for mb, tensors in enumerate(_messages()):
            post.notify(1, 0, 1, mb, MessageKind.ACTIVATION if mb % 2 == 0 else MessageKind.GRADIENT)
            post.send(1, MessageKind.ACTIVATION, 0, 1, mb, tensors)
    else:
        notices: list[tuple[int, int, int]] = []
        data: list[int] = []
        while len(notices) + len(data) < 2 * len(_messages()):
            msg = post.get(30)
            assert msg is not None, "a message or notice did not arrive"
            if msg.kind is MessageKind.STARTED:
                assert msg.tensors == [] and msg.of is not None
                notices.append((msg.stage, msg.mb, int(msg.of)))
            elif msg.kind is not MessageKind.STOP:  # the peer's goodbye may come before its last notices
                data.append(msg.mb)
        result = (notices, data, False)
    post.close(timeout=allow(30))
    if result is not None:
        result = (result[0], result[1], any(thread.is_alive() for thread in post._threads))
    return result


def test_notices_travel_on_their_own_channel_and_close_ends_both_threads() -> None:
    notices, data, alive = run_ranks(_notice_worker, 2, timeout=60)[1]
    count = len(_messages())
    assert data == list(range(count))  # the data channel keeps its order whatever the notices do
    assert notices == [
        (1, mb, int(MessageKind.ACTIVATION if mb % 2 == 0 else MessageKind.GRADIENT)) for mb in range(count)
    ]
    assert not alive  # the peer's close reached the notice thread too


def test_a_lost_connection_is_worded_as_one_and_a_peers_abort_as_its_words() -> None:
    # A crashed peer says nothing: its connection closes under the receiving thread, and the error names the
    # backend's reason without gloo's source path and advice.
    gloo = (
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:5506. This is typically caused by a remote worker crashing. Check the logs of the remote "
        "worker before reporting an error. GLHF!"
    )
    lost = lost_connection(1, RuntimeError(gloo))
    assert (lost.kind, lost.peer, lost.lost) == (MessageKind.ABORT, 1, True)
    assert what_the_peer_said(lost) == "its connection closed (Connection closed by peer [127.0.0.1]:5506)"
    assert what_the_peer_said(lost_connection(1, RuntimeError(""))) == "its connection closed (no reason given)"
    said = Message(MessageKind.ABORT, -1, -1, -1, [], 1, 0.0, "rank 1: out of memory")
    assert what_the_peer_said(said) == "it said: rank 1: out of memory"


def _sends_worker(rank: int, world: int) -> list[list[int]] | None:
    group = dist.new_group(backend="gloo")
    post = GlooTransport([1 - rank], torch.device("cpu"), group=group)
    assert not post.sender.threaded  # a CPU rank posts its own sends (see hintpipe.runtime.transport.sender)
    sizes: list[int] = []
    if rank == 0:
        post_data = post.sender._post

        def counted(tensor: torch.Tensor, peer: int) -> Any:
            sizes.append(tensor.nbytes)
            return post_data(tensor, peer)

        post.sender._post = counted
        per_message = []
        for mb, tensors in enumerate(_messages()[:5]):
            post.send(1, MessageKind.ACTIVATION, 0, 1, mb, tensors)
            post.flush(allow(30))
            per_message.append(list(sizes))
            sizes.clear()
    else:
        for _ in range(5):
            assert post.get(30) is not None, "a message did not arrive"
    post.close(timeout=allow(30))
    return per_message if rank == 0 else None


def test_a_message_whose_payload_fits_the_posted_receive_is_one_send() -> None:
    # Header and payload travel as one gloo message into the one posted receive ([Note: pre-posted payloads]):
    # 512 header bytes, then the payload's bytes up to what is posted (the largest payload so far), the rest
    # as a message of its own.
    sent = run_ranks(_sends_worker, 2, timeout=60)[0]
    assert sent == [
        [HEAD, 128],  # the first: nothing posted for its payload yet
        [HEAD + 128],  # the same size: one send
        [HEAD + 24],  # smaller: one send, its own bytes only
        [HEAD],  # no bytes: the header alone
        [HEAD + 128, 512 - 128],  # larger: the posted part with the header, then the rest
    ]
