"""The two transports: the gloo mailbox's staging of device tensors, and the NCCL transport's split of
headers (gloo) from payloads (per-direction links).

Without a GPU, staging is a no-op copy, so the staging pool's reuse and
ordering rules are tested directly; the NCCL transport's code path runs with
its links on gloo (see [Note: NCCL links are deadlock-free] in
hintpipe.runtime.transport.links).
"""

from __future__ import annotations

import functools
import math
import os
import queue
import time
from collections.abc import Sequence

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conftest import allow, hang_bound
from hintpipe.runtime.assembly import Seams
from hintpipe.runtime.errors import RankFailure
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.runtime.transport.links import Link, NcclTransport, as_bytes, deliver_when_arrived
from hintpipe.runtime.transport.mailbox import GlooTransport
from hintpipe.runtime.transport.registry import TransportChoice, choose_transport
from hintpipe.runtime.transport.staging import MIN_BUFFER, Staging, StagingPool, size_class
from hintpipe.runtime.transport.wire import Message, MessageKind, Value, decode_meta, encode_meta, pack, unpack

CPU, CUDA = torch.device("cpu"), torch.device("cuda")

# -- the staging pool ----------------------------------------------------------------------------


def test_size_classes_are_powers_of_two_from_the_smallest_buffer() -> None:
    assert [size_class(n) for n in (0, 1, MIN_BUFFER, MIN_BUFFER + 1, 5000, 1 << 20, (1 << 20) + 1)] == [
        MIN_BUFFER,
        MIN_BUFFER,
        MIN_BUFFER,
        2 * MIN_BUFFER,
        2 * MIN_BUFFER,
        1 << 20,
        1 << 21,
    ]
    with pytest.raises(ValueError, match=r"^a buffer cannot hold -1 bytes$"):
        size_class(-1)


def _rounding_pool(keep_bytes: int = 1 << 30) -> StagingPool:
    """A pool that keeps size classes like a GPU rank's, in plain host memory (pinning needs CUDA)."""
    return StagingPool(pin=False, rounded=True, keep_bytes=keep_bytes)


def test_a_buffer_given_back_is_reused_for_its_size_class() -> None:
    pool = _rounding_pool()
    a = pool.take(5000)
    assert a.numel() == 5000 and a.untyped_storage().nbytes() == 2 * MIN_BUFFER
    pool.give_back(a)
    b = pool.take(6000)  # another size, same class: the same memory
    assert b.data_ptr() == a.data_ptr() and b.numel() == 6000
    c = pool.take(6000)  # the class is empty again: a new buffer
    assert c.data_ptr() != a.data_ptr()
    assert pool.allocated == 2


def test_a_buffer_is_not_reused_while_its_transfer_is_in_flight() -> None:
    pool = _rounding_pool()
    done = {"copy": False}
    a = pool.take(100)
    pool.give_back(a, lambda: done["copy"])
    b = pool.take(100)
    assert b.data_ptr() != a.data_ptr() and pool.in_flight == 1
    done["copy"] = True
    c = pool.take(100)
    assert c.data_ptr() == a.data_ptr() and pool.in_flight == 0


def test_buffers_come_back_in_the_order_their_transfers_were_issued() -> None:
    # Transfers on one stream finish in order: an unfinished head holds back a later, finished one.
    pool = _rounding_pool()
    done = [False, False]
    first, second = pool.take(100), pool.take(100)
    pool.give_back(first, lambda: done[0])
    pool.give_back(second, lambda: done[1])
    done[1] = True
    assert pool.in_flight == 2 and pool.free_bytes == 0
    done[0] = True
    assert pool.take(100).data_ptr() in (first.data_ptr(), second.data_ptr())
    assert pool.in_flight == 0 and pool.free_bytes == MIN_BUFFER  # both back, one taken again


def test_the_pool_keeps_at_most_its_bound_of_free_bytes() -> None:
    pool = _rounding_pool(keep_bytes=2 * MIN_BUFFER)
    buffers = [pool.take(10) for _ in range(3)]
    for b in buffers:
        pool.give_back(b)
    assert pool.free_bytes == 2 * MIN_BUFFER  # the third was released, not kept


def test_a_cpu_ranks_pool_keeps_exact_sizes() -> None:
    pool = StagingPool(pin=False)
    a = pool.take(100)
    assert a.untyped_storage().nbytes() == 100
    pool.give_back(a)
    assert pool.take(101).data_ptr() != a.data_ptr()
    assert pool.take(100).data_ptr() == a.data_ptr()


def test_on_a_cpu_rank_staging_hands_received_buffers_over_or_back() -> None:
    staging = Staging(CPU)
    assert not staging.staged
    payload = torch.arange(8, dtype=torch.float32)
    raw = payload.view(torch.uint8)
    assert staging.outgoing(raw) == (raw, None, None)  # nothing staged, nothing to wait for: the bytes themselves
    buffer = staging.pool.take(32)
    view = [buffer.view(torch.float32)]
    tensors, ready = staging.arrived(list(view), buffer)
    assert ready is None and tensors[0] is view[0]
    assert staging.pool.free_bytes == 0  # the tensors view the buffer: handed over, not reused
    other = staging.pool.take(32)
    copied: list[torch.Tensor | None] = [other.view(torch.float32).clone()]
    staging.arrived(copied, other)
    assert staging.pool.free_bytes == 32  # nothing views it: back for the next receive


# -- choosing a transport ---------------------------------------------------------------------------


def test_auto_picks_nccl_only_for_ranks_with_a_gpu_each() -> None:
    assert choose_transport("auto", CPU, own_gpu=False) is TransportChoice.GLOO
    assert choose_transport("auto", CUDA, own_gpu=True) is TransportChoice.NCCL
    assert choose_transport("auto", CUDA, own_gpu=False) is TransportChoice.GLOO
    assert choose_transport("gloo", CUDA, own_gpu=True) is TransportChoice.GLOO
    assert choose_transport("nccl", CUDA, own_gpu=True) is TransportChoice.NCCL


def test_impossible_transports_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^transport nccl moves tensors between GPUs, but the ranks compute on cpu$"):
        choose_transport("nccl", CPU, own_gpu=False)
    with pytest.raises(ValueError, match=r"^transport nccl needs a GPU per rank \(NCCL refuses two ranks on one"):
        choose_transport("nccl", CUDA, own_gpu=False)
    with pytest.raises(ValueError, match=r"^unknown transport 'mpi': choose one of auto, gloo, nccl$"):
        choose_transport("mpi", CPU, own_gpu=False)


# -- the gloo mailbox reuses its receive buffers ---------------------------------------------------------


def _reuse_worker(rank: int, world: int) -> tuple[int, int] | None:
    group = dist.new_group(backend="gloo")
    post = GlooTransport([1 - rank], CPU, group=group)
    sizes = [64, 64, 10, 20, 30, 40, 50, 60, 5, 64]
    result = None
    if rank == 0:
        for mb, n in enumerate(sizes):
            post.send(1, MessageKind.ACTIVATION, 0, 1, mb, [torch.full((n,), float(mb))])
    else:
        for mb, n in enumerate(sizes):
            msg = post.get(30)
            assert msg is not None and msg.mb == mb
            assert torch.equal(msg.tensors[0], torch.full((n,), float(mb)))  # type: ignore[arg-type]
        # Payloads smaller than the posted one are copied out: the posted buffer goes back to the pool and is
        # posted again for the next message, so steady traffic allocates only for full-size messages.
        result = (post.staging.pool.allocated, sum(1 for n in sizes if n == 64))
    post.close(timeout=allow(30))
    return result


def test_the_gloo_mailbox_reposts_buffers_that_smaller_payloads_leave() -> None:
    result = run_ranks(_reuse_worker, 2, timeout=60)[1]
    assert result is not None
    allocated, full_size = result
    # A new buffer after each full-size message (whose tensors keep the buffer they came in); none after the
    # smaller ones, and none before the first payload, for which nothing is posted (a buffer taken for it
    # never went back: on a GPU, a pinned buffer per peer).
    assert allocated == full_size


# -- the wire --------------------------------------------------------------------------------------


def test_pack_makes_its_buffer_where_the_tensors_are() -> None:
    # A GPU rank's closing word is host text: a buffer made on the rank's device would not join it.
    text = torch.tensor(list(b"rank 1: boom"), dtype=torch.uint8)
    buffer, nbytes = pack([text], torch.device("meta"))
    assert (buffer.device, buffer.numel(), nbytes) == (CPU, 16, 16)  # 12 bytes, aligned to 16: nothing padded
    assert bytes(buffer[:12].tolist()) == b"rank 1: boom"
    elsewhere, size = pack([torch.empty(3, device="meta")], CPU)
    assert (elsewhere.device.type, elsewhere.numel(), size) == ("meta", 16, 16)
    nothing, none = pack([None], torch.device("meta"))
    assert (nothing.device.type, nothing.numel(), none) == ("meta", 0, 0)


def test_numbers_travel_in_the_header_and_come_back_as_the_numbers_sent() -> None:
    """[Note: numbers in the header]: a number takes no payload bytes, whatever the device of the tensors
    beside it, and is described by its type and its bits, so it comes back the same Python number."""
    hidden = torch.empty(2, 3, device="meta")
    values: list[Value] = [hidden, 12, -(2**63), 2**63 - 1, 0.1, -0.0, float("inf"), True, None]
    meta = encode_meta(values)
    assert meta[: 2 + hidden.dim()] == [0, 2, 2, 3]  # float32, two dimensions: 2 x 3
    assert meta[4:7] == [4, -2, 12]  # int64's code, a number, its value
    buffer, nbytes = pack(values, CPU)
    assert (buffer.device.type, nbytes) == ("meta", 24)  # the tensor's bytes only
    back = unpack(torch.zeros(nbytes, dtype=torch.uint8), decode_meta(meta, len(values)))
    assert isinstance(back[0], torch.Tensor) and back[0].shape == (2, 3)
    assert [(type(v), v) for v in back[1:]] == [(type(v), v) for v in values[1:]]
    assert isinstance(back[5], float) and math.copysign(1.0, back[5]) == -1.0  # -0.0 keeps its sign: its bits
    with pytest.raises(ValueError, match=r"^cannot send the number 9223372036854775808: beyond int64$"):
        encode_meta([2**63])
    with pytest.raises(TypeError, match=r"^cannot send a str: a message carries tensors and numbers$"):
        encode_meta(["12"])  # type: ignore[list-item]


def test_complex_tensors_travel_as_their_bytes() -> None:
    """Llama 4 passes its rotary frequencies (``freqs_cis``, complex64) from layer to layer: a cut between two
    layers sent them, and every rank failed with ``cannot send a tensor of dtype torch.complex64``."""
    sent = [torch.randn(2, 3, dtype=torch.complex64), torch.randn(4, dtype=torch.complex128)]
    values: list[Value] = [*sent, 7]
    meta = encode_meta(values)
    buffer, nbytes = pack(values, CPU)
    assert nbytes == 2 * 3 * 8 + 4 * 16
    back = unpack(buffer, decode_meta(meta, len(values)))
    for received, tensor in zip(back[:2], sent, strict=True):
        assert isinstance(received, torch.Tensor) and received.dtype == tensor.dtype
        assert torch.equal(received, tensor)
    assert back[2] == 7


# -- the NCCL transport's protocol, its links on gloo --------------------------------------------------


def test_a_link_moves_every_dtype_as_its_bytes() -> None:
    # NCCL moves no int16; as bytes, every dtype goes (a bool, a 0-d tensor, a transposed view).
    for tensor in (
        torch.tensor([-3, 300], dtype=torch.int16),
        torch.tensor([True, False, True]),
        torch.tensor(2.5),
        torch.arange(6.0).reshape(2, 3).t(),
    ):
        raw = as_bytes(tensor)
        assert raw.dtype == torch.uint8 and raw.numel() == tensor.nbytes
        received = torch.empty(tensor.shape, dtype=tensor.dtype)
        as_bytes(received).copy_(raw)  # a receive into the bytes of a tensor allocated from the header
        assert torch.equal(received, tensor)


class _Arrival:
    """A transfer that records what the inbox held when it was waited for."""

    def __init__(self, inbox: queue.SimpleQueue[Message]) -> None:
        self.inbox = inbox
        self.waited_with: list[int] = []

    def wait(self) -> None:
        self.waited_with.append(self.inbox.qsize())

    def use(self, tensors: Sequence[torch.Tensor | None]) -> None:
        raise AssertionError("the receiving thread never makes a stream wait")


def test_a_link_message_enters_the_inbox_once_its_payload_is_here() -> None:
    inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
    arrival = _Arrival(inbox)
    message = Message(MessageKind.ACTIVATION, 0, 1, 2, [torch.ones(1)], peer=0, ready=arrival)
    deliver_when_arrived(inbox, message)
    assert arrival.waited_with == [0]  # waited for before the message was in the inbox
    assert inbox.get_nowait() is message and message.arrived > 0.0 and message.ready is arrival


def _link_messages(sender: int) -> list[list[Value]]:
    g = torch.Generator().manual_seed(sender)
    return [
        [torch.randn(4, 8, generator=g)],
        [torch.randn(2, 3, generator=g), None, torch.randint(0, 9, (5,), generator=g)],
        [torch.randn(16, 8, generator=g, dtype=torch.float64)],
        [torch.ones(3, dtype=torch.bool), torch.empty(0, 4)],
        [torch.randn(1, 2, generator=g).to(torch.bfloat16) for _ in range(30)],  # a description beyond the header
        [torch.randn(7, generator=g)],
        [torch.tensor([-2, 7, 300], dtype=torch.int16), torch.tensor(3.5)],  # no int16 on NCCL: bytes go
        [torch.randn(3, generator=g), 17, 2.5, False],  # numbers in the header, never on the link
    ]


def _link_worker(rank: int, world: int) -> list[tuple[int, int, list[Value]]]:
    headers = dist.new_group(backend="gloo")
    up = dist.new_group([0, 1], backend="gloo")  # 0 -> 1
    down = dist.new_group([0, 1], backend="gloo")  # 1 -> 0
    peer = 1 - rank
    outgoing = {peer: Link(up if rank == 0 else down, peer)}
    incoming = {peer: Link(down if rank == 0 else up, peer)}
    post = NcclTransport([peer], CPU, headers, outgoing=outgoing, incoming=incoming, notices=True)
    # Both directions at once, each with a notice in between: as a pipeline's activations and gradients cross.
    for mb, tensors in enumerate(_link_messages(rank)):
        post.send(peer, MessageKind.ACTIVATION if rank == 0 else MessageKind.GRADIENT, 3, 1, mb, tensors)
        post.notify(peer, 3, 1, mb, MessageKind.ACTIVATION)
    received: list[tuple[int, int, list[Value]]] = []
    while len(received) < len(_link_messages(peer)):
        msg = post.get(30)
        assert msg is not None, "a message did not arrive"
        if msg.kind is not MessageKind.STARTED:
            received.append((int(msg.kind), msg.mb, msg.tensors))
    post.close(timeout=allow(30), error="done here" if rank == 1 else None)
    last = post.get(30)
    while last is not None and last.kind is MessageKind.STARTED:  # a late notice: notices and data are unordered
        last = post.get(30)
    assert last is not None
    received.append((int(last.kind), -1, [torch.tensor(list((last.error or "").encode()), dtype=torch.uint8)]))
    return received


def test_the_link_transport_delivers_every_message_whole_and_in_order_both_ways() -> None:
    results = run_ranks(_link_worker, 2, timeout=60)
    for rank, received in enumerate(results):
        sent = _link_messages(1 - rank)
        kind = MessageKind.ACTIVATION if rank == 1 else MessageKind.GRADIENT
        *data, closing = received
        assert [(k, mb) for k, mb, _ in data] == [(kind, mb) for mb in range(len(sent))]
        for (_, mb, got), expected in zip(data, sent, strict=True):
            assert len(got) == len(expected), mb
            for a, b in zip(got, expected, strict=True):
                if isinstance(b, torch.Tensor):
                    assert isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), mb
                else:  # None, or a number: the same value of the same type
                    assert (type(a), a) == (type(b), b), mb
        # The closing word travels on the header channel: rank 1 failed on purpose, rank 0 stopped.
        word = closing[2][0]
        assert isinstance(word, torch.Tensor)
        text = bytes(word.tolist()).decode()
        assert (closing[0], text) == ((MessageKind.ABORT, "done here") if rank == 0 else (MessageKind.STOP, ""))


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((out - target) ** 2).mean()


def _layers(stages: int) -> list[nn.Module]:
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(6, 6), nn.Tanh()) for _ in range(stages)]


#: The NCCL transport's code path with its payload links on gloo, on CPU ranks.
LINKS = Seams(transport=functools.partial(NcclTransport.connect, backend="gloo"))


def _batches(m: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(1 + (i * 3) % 5, 6, generator=g) for i in range(m)]
    return xs, [torch.sin(x) for x in xs]


def _pipeline_worker(rank: int, world: int, hint: str, chunks: int, policy: str) -> dict[str, torch.Tensor]:
    modules = _layers(world * chunks)
    with Pipeline.from_modules(
        modules, loss_fn=_mse, microbatches=4, hint=hint, chunks=chunks, policy=policy, timeout=60, seams=LINKS
    ) as pipe:
        assert isinstance(pipe.carrier, NcclTransport)
        xs, ys = _batches(4)
        pipe.step(xs, ys)
        return {f"{s}.{n}": p.grad.clone() for s in pipe.stages for n, p in modules[s].named_parameters()}  # type: ignore[union-attr]


@pytest.mark.parametrize(("hint", "chunks", "policy"), [("1f1b", 1, "ready"), ("interleaved-1f1b", 2, "fixed")])
def test_a_pipeline_over_links_matches_the_unsplit_model(hint: str, chunks: int, policy: str) -> None:
    # Interleaved: the last rank's activations wrap around to rank 0, a link of its own.
    results = run_ranks(_pipeline_worker, 2, hint, chunks, policy, timeout=120)
    modules = _layers(2 * chunks)
    model = nn.Sequential(*modules)
    xs, ys = _batches(4)
    for x, y in zip(xs, ys, strict=True):
        torch.autograd.backward(_mse(model(x), y) / len(xs))
    expected = {f"{s}.{n}": p.grad for s, m in enumerate(modules) for n, p in m.named_parameters()}
    got = {name: grad for result in results for name, grad in result.items()}
    assert set(got) == set(expected)
    for name, grad in got.items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-5, atol=1e-6, msg=name)


class _Dies(nn.Module):
    """A linear layer whose process dies abruptly on its ``call``-th forward."""

    def __init__(self, call: int) -> None:
        super().__init__()
        self.layer = nn.Linear(6, 6)
        self.calls, self.call = 0, call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.call:
            os._exit(17)
        out: torch.Tensor = self.layer(x)
        return out


def _crash_over_links_worker(rank: int, world: int) -> None:
    modules: list[nn.Module] = [nn.Linear(6, 6), _Dies(4 + 3), nn.Linear(6, 6)]  # dies in the second step
    with Pipeline.from_modules(modules, loss_fn=_mse, microbatches=4, hint="1f1b", timeout=8, seams=LINKS) as pipe:
        xs, ys = _batches(4)
        for _ in range(3):
            pipe.step(xs, ys)


def test_a_killed_rank_ends_every_rank_over_links_too() -> None:
    began = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(_crash_over_links_worker, 3, timeout=60)
    message = str(info.value)
    assert "rank 1: exited without a result" in message
    for rank in (0, 2):  # both neighbours name the dead rank, through the header channel or the watchdog
        line = next(line for line in message.splitlines() if line.startswith(f"rank {rank}:"))
        assert "rank 1" in line, line
    assert time.monotonic() - began < hang_bound(8)
