"""The device a rank computes on: chosen once, and everything the pipeline holds or receives is there.

On a machine without CUDA these run the device-generic code with ``cpu``; the
CUDA branches are exercised by benchmarks/gpu where a GPU is available.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from hintpipe.runtime.device import rank_device, to_device
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.runtime.wire import Message

CUDA = torch.cuda.is_available() and torch.cuda.device_count() > 0


def test_the_choice_of_device() -> None:
    assert rank_device(None) == torch.device("cpu")
    assert rank_device("cpu") == torch.device("cpu")
    assert rank_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^unknown device 'gpu': choose one of auto, cpu, cuda$"):
        rank_device("gpu")


@pytest.mark.skipif(CUDA, reason="checks the machine without CUDA")
def test_without_cuda_auto_is_the_cpu_and_cuda_is_refused() -> None:
    assert rank_device("auto", rank=3) == torch.device("cpu")
    message = r"^device cuda was asked for, but torch.cuda.is_available\(\) is False on this machine$"
    with pytest.raises(ValueError, match=message):
        rank_device("cuda")


def test_to_device_reaches_tensors_inside_containers() -> None:
    value = (torch.ones(2), [torch.zeros(1), {"a": torch.arange(3)}], 7)
    moved = to_device(value, torch.device("cpu"))
    assert moved[2] == 7 and isinstance(moved[1], list) and isinstance(moved[1][1], dict)
    assert moved[0] is value[0]  # already there: not copied


class _Spy:
    """A transport that keeps what it delivers."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.delivered: list[Message] = []

    def get(self, timeout: float | None) -> Message | None:
        msg: Message | None = self.inner.get(timeout)
        if msg is not None:
            self.delivered.append(msg)
        return msg

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _device_worker(rank: int, world: int, device: str) -> tuple[str, list[str], list[str], int]:
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 2)]
    with Pipeline.from_modules(
        stages, loss_fn=nn.functional.mse_loss, microbatches=4, policy="ready", device=device
    ) as pipe:
        spy = _Spy(pipe.transport)
        pipe.transport = spy
        xs = [torch.randn(n, 4) for n in (1, 3, 2, 5)]
        ys = [torch.randn(n, 2) for n in (1, 3, 2, 5)]
        for _ in range(3):
            pipe.step(xs if rank == 0 else None, ys if rank == 1 else None)
        params = [p for m in pipe.modules.values() for p in m.parameters()]
        held = sorted({str(p.device) for p in params} | {str(p.grad.device) for p in params if p.grad is not None})
        received = [t for msg in spy.delivered for t in msg.tensors if t is not None]
        places = sorted({str(t.device) for t in received})
        return str(pipe.device), held, places, len(received)


def test_every_parameter_and_every_delivered_tensor_is_on_the_ranks_device() -> None:
    for device, held, received, count in run_ranks(_device_worker, 2, "cpu", timeout_s=120):
        assert device == "cpu"
        assert held == ["cpu"]
        assert received == ["cpu"] and count >= 3 * 4  # activations to rank 1, gradients to rank 0
