"""The wire format of messages between ranks.

Per message: a header of :data:`HEADER` int64 ``(kind, step, stage, mb,
tensors, meta_len, payload_bytes, meta...)`` where ``meta`` describes each
tensor as ``(dtype code, ndim, *shape)`` (``ndim = -1`` marks an absent
tensor, e.g. no gradient for an integer input), then one byte payload holding
every tensor, each start aligned to 8 bytes. A description too long for the
header follows as a message of its own.
"""

from __future__ import annotations

import dataclasses
import enum
import math
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
]
_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}
HEADER = 64
INLINE = HEADER - 7  # tensor descriptions that fit in the header itself


@dataclasses.dataclass
class Message:
    """A message as the rank sees it."""

    kind: MessageKind
    step: int
    stage: int
    mb: int
    tensors: list[torch.Tensor | None]
    peer: int
    arrived: float = 0.0  # time.perf_counter() when it came
    error: str | None = None
    of: MessageKind | None = None  # a STARTED notice: the kind of the data on its way
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
    values = [int(kind), step, stage, mb, count, len(meta), nbytes] + (meta if len(meta) <= INLINE else [])
    header = torch.tensor(values + [0] * (HEADER - len(values)), dtype=torch.int64)
    return header, (torch.tensor(meta, dtype=torch.int64) if len(meta) > INLINE else None)


def encode_meta(tensors: Sequence[torch.Tensor | None]) -> list[int]:
    meta: list[int] = []
    for t in tensors:
        if t is None:
            meta += [0, -1]
            continue
        if t.dtype not in _CODE:
            raise TypeError(f"cannot send a tensor of dtype {t.dtype}; supported: {_DTYPES}")
        meta += [_CODE[t.dtype], t.dim(), *t.shape]
    return meta


def decode_meta(meta: list[int], count: int) -> list[tuple[torch.dtype, tuple[int, ...]] | None]:
    out: list[tuple[torch.dtype, tuple[int, ...]] | None] = []
    i = 0
    for _ in range(count):
        code, ndim = meta[i], meta[i + 1]
        i += 2
        if ndim < 0:
            out.append(None)
            continue
        out.append((_DTYPES[code], tuple(meta[i : i + ndim])))
        i += ndim
    return out


_ALIGN = 8


def pack(tensors: Sequence[torch.Tensor | None], device: torch.device) -> tuple[torch.Tensor, int]:
    """All tensors' bytes in one buffer (each start aligned to 8 bytes): one
    payload per message, whatever the number of tensors. Returns it and its size.

    The buffer is where the tensors are (``device`` only when there are none):
    a GPU rank's closing word is host text.
    """
    parts: list[torch.Tensor] = []
    offset = 0
    for t in tensors:
        if t is None or t.numel() == 0:
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


def unpack(payload: torch.Tensor, specs: list[tuple[torch.dtype, tuple[int, ...]] | None]) -> list[torch.Tensor | None]:
    out: list[torch.Tensor | None] = []
    offset = 0
    for spec in specs:
        if spec is None:
            out.append(None)
            continue
        dtype, shape = spec
        count = math.prod(shape)
        size = count * torch.empty((), dtype=dtype).element_size()
        if count == 0:
            out.append(torch.empty(shape, dtype=dtype, device=payload.device))
            continue
        out.append(payload[offset : offset + size].view(dtype).reshape(shape))
        offset += size + (-(offset + size) % _ALIGN)
    return out
