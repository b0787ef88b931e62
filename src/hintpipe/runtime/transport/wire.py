"""The wire format of messages between ranks.

Per message: a header of :data:`HEADER` int64 ``(kind, step, stage, mb,
values, meta_len, payload_bytes, meta...)`` where ``meta`` describes each
value the message carries: a tensor as ``(dtype code, ndim, *shape)``, an
absent tensor (e.g. no gradient for an integer input) as ``(0, -1)``, a
number as ``(dtype code, -2, its bits)``; then one byte payload holding every
tensor, each start aligned to 8 bytes. A description too long for the header
follows as a message of its own.

[Note: numbers in the header]
A stage may send a number on (a sequence length: [Note: numbers cross a cut
on the host] in :mod:`hintpipe.planner.stagegen`). It travels in the
message's description, as a shape does: ``int64`` code and the value, or
``float64`` code and the value's IEEE-754 bits, or ``bool`` code and 0 or 1.
So it never becomes a tensor: not on the sender's device (whose stream a
``.item()`` would wait for), not in the payload (a GPU rank would move it to
its device on arrival), and the receiver gets back the Python number that
was sent, ``meta`` devices included. Its gradient slot, on the way back, is
an absent tensor.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import struct
import time
from collections.abc import Sequence
from typing import Any

import torch

from hintpipe.runtime.errors import backend_reason


class MessageKind(enum.IntEnum):
    ACTIVATION = 0  # forward output of ``stage - 1``, input of F(stage, mb)
    GRADIENT = 1  # input gradient of ``stage + 1``, output gradient for B(stage, mb)
    STOP = 2  # the peer is done and will send nothing more
    ABORT = 3  # the peer failed; ``mb`` carries nothing, the error follows as text
    DECISION = 4  # the tensor-parallel leader's choice: ``mb`` holds the task's position (never on the wire)
    STARTED = 5  # the task producing the input of ``(stage, mb)`` started (a notice: no tensors, its own channel)
    WANTED = 6  # notices of the task producing the input of ``(stage, mb)`` asked for (its consumer to its producer)


_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,  # rotary frequencies some models pass between layers (Llama 4's freqs_cis)
    torch.complex128,
]
_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
HEADER = 64
INLINE = HEADER - 7  # tensor descriptions that fit in the header itself

#: A number a message carries in its header ([Note: numbers in the header]; a bool is an int).
Number = int | float
#: What a message carries, each in its place: a tensor, a number, or None (an absent tensor).
Value = torch.Tensor | Number | None
#: A tensor as a message's description gives it: its dtype and shape.
TensorSpec = tuple[torch.dtype, tuple[int, ...]]

_ABSENT, _NUMBER = -1, -2  # the ``ndim`` of an absent tensor, of a number
_INT64 = (-(2**63), 2**63 - 1)


@dataclasses.dataclass
class Message:
    """A message as the rank sees it."""

    kind: MessageKind
    step: int
    stage: int
    mb: int
    #: What it carries, in order: tensors, numbers (from the header) and None for an absent tensor.
    tensors: list[Value]
    peer: int
    arrived: float = 0.0  # time.perf_counter() when it came
    error: str | None = None
    of: MessageKind | None = None  # a STARTED or WANTED notice: the kind of the data on its way
    #: The tensors' transfer to the device (a :class:`hintpipe.device.Arrival`; None: usable now): the step
    #: loop lets the compute stream use them only after it, right before the task that consumes them.
    ready: Any = None
    #: An ABORT the peer did not send: the connection to it failed under the receiving thread (``error``: the
    #: backend's text).
    lost: bool = False


def lost_connection(peer: int, exc: BaseException) -> Message:
    """What a receiving thread puts in the inbox when its connection to ``peer`` fails: an ABORT that the peer
    did not send (it crashed, was killed, or the group was torn down), worded by :func:`what_the_peer_said`."""
    return Message(MessageKind.ABORT, -1, -1, -1, [], peer, time.perf_counter(), str(exc), lost=True)


def what_the_peer_said(abort: Message) -> str:
    """An ABORT's text for an error message: the peer's own words (``it said: ...``), or, for a connection
    that failed under it, the backend's reason without its source path and advice (gloo's
    ``[.../pair.cc:553] Connection closed by peer [127.0.0.1]:5506. This is typically caused by ...``)."""
    if not abort.lost:
        return f"it said: {abort.error}"
    return f"its connection closed ({backend_reason(abort.error or '') or 'no reason given'})"


def encode_header(
    kind: MessageKind, step: int, stage: int, mb: int, count: int, meta: list[int], nbytes: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A message's header, and its tensor description as a message of its own when too long to fit (else None)."""
    values, extra = header_fields(kind, step, stage, mb, count, meta, nbytes)
    return torch.tensor(values + [0] * (HEADER - len(values)), dtype=torch.int64), extra


def header_fields(
    kind: MessageKind, step: int, stage: int, mb: int, count: int, meta: list[int], nbytes: int
) -> tuple[list[int], torch.Tensor | None]:
    """A message's header fields (the header's first ones, the rest being zeros), and its tensor description
    as a message of its own when too long to fit (else None)."""
    values = [int(kind), step, stage, mb, count, len(meta), nbytes] + (meta if len(meta) <= INLINE else [])
    return values, (torch.tensor(meta, dtype=torch.int64) if len(meta) > INLINE else None)


def write_header(values: Sequence[int], into: bytearray) -> None:
    """Write the header fields ``values`` into the first bytes of ``into`` (int64 in the host's order, as a
    tensor's view reads them back; the rest of a new ``bytearray`` is zeros): a header built without a tensor of
    its own costs a third of one."""
    struct.pack_into(f"={len(values)}q", into, 0, *values)


def encode_meta(values: Sequence[Value]) -> list[int]:
    """The description of ``values``: each tensor's dtype and shape, each number itself
    ([Note: numbers in the header]).

    Raises:
        TypeError: a tensor of a dtype the wire does not carry, or a value that is neither.
        ValueError: an int beyond int64.
    """
    meta: list[int] = []
    for value in values:
        if value is None:
            meta += [0, _ABSENT]
        elif isinstance(value, torch.Tensor):
            if value.dtype not in _CODE:
                raise TypeError(f"cannot send a tensor of dtype {value.dtype}; supported: {_DTYPES}")
            meta += [_CODE[value.dtype], value.dim(), *value.shape]
        else:
            meta += _number_meta(value)
    return meta


def _number_meta(value: object) -> tuple[int, int, int]:
    """A number's ``(dtype code, -2, bits)``."""
    if isinstance(value, bool):
        return _CODE[torch.bool], _NUMBER, int(value)
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise ValueError(f"cannot send the number {value}: beyond int64")
        return _CODE[torch.int64], _NUMBER, value
    if isinstance(value, float):
        return _CODE[torch.float64], _NUMBER, struct.unpack("<q", struct.pack("<d", value))[0]
    raise TypeError(f"cannot send a {type(value).__name__}: a message carries tensors and numbers")


def _number(code: int, bits: int) -> Number:
    """The number ``_number_meta`` described."""
    dtype = _DTYPES[code]
    if dtype is torch.bool:
        return bool(bits)
    if dtype is torch.float64:
        value: float = struct.unpack("<d", struct.pack("<q", bits))[0]
        return value
    return bits


def decode_meta(meta: list[int], count: int) -> list[TensorSpec | Number | None]:
    """What :func:`encode_meta` described: per value, a tensor's dtype and shape, a number, or None."""
    out: list[TensorSpec | Number | None] = []
    i = 0
    for _ in range(count):
        code, ndim = meta[i], meta[i + 1]
        i += 2
        if ndim == _ABSENT:
            out.append(None)
        elif ndim == _NUMBER:
            out.append(_number(code, meta[i]))
            i += 1
        else:
            out.append((_DTYPES[code], tuple(meta[i : i + ndim])))
            i += ndim
    return out


def tensors_of(values: Sequence[Value]) -> list[torch.Tensor]:
    """The tensors among ``values`` (not the numbers, not the absent ones)."""
    return [v for v in values if isinstance(v, torch.Tensor)]


_ALIGN = 8


def pack(values: Sequence[Value], device: torch.device) -> tuple[torch.Tensor, int]:
    """All tensors' bytes in one buffer (each start aligned to 8 bytes): one
    payload per message, whatever the number of tensors (numbers travel in the
    header). Returns it and its size.

    The buffer is where the tensors are (``device`` only when there are none):
    a GPU rank's closing word is host text.
    """
    parts: list[torch.Tensor] = []
    offset = 0
    for t in tensors_of(values):
        if t.numel() == 0:
            continue
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        parts.append(raw)
        offset += raw.numel()
        pad = -offset % _ALIGN
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=raw.device))
            offset += pad
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=device), 0
    return torch.cat(parts), offset


def unpack(payload: torch.Tensor, specs: Sequence[TensorSpec | Number | None]) -> list[Value]:
    """The values ``specs`` describes: tensors viewing ``payload``'s bytes, numbers as they are."""
    out: list[Value] = []
    offset = 0
    for spec in specs:
        if not isinstance(spec, tuple):  # a number, or an absent tensor
            out.append(spec)
            continue
        dtype, shape = spec
        count = math.prod(shape)
        size = count * dtype.itemsize
        if count == 0:
            out.append(torch.empty(shape, dtype=dtype, device=payload.device))
            continue
        out.append(payload[offset : offset + size].view(dtype).reshape(shape))
        offset += size + (-(offset + size) % _ALIGN)
    return out
