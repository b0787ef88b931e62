"""Where a rank computes (:mod:`hintpipe.device`): the choice of device, checked once, with no CUDA call on a CPU
rank; a GPU of its own per rank; and tensors moved there wherever a container holds them.

On a machine without CUDA these run the device-generic code with ``cpu``; the CUDA branches are exercised by
benchmarks/gpu where a GPU is available.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hintpipe.device import gpu_identity, own_gpu, rank_device, to_device
from hintpipe.device_choice import DeviceChoice

CUDA = torch.cuda.is_available() and torch.cuda.device_count() > 0


def test_the_choice_of_device() -> None:
    assert rank_device(None) == torch.device("cpu")
    assert rank_device("cpu") == torch.device("cpu")
    assert rank_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match=r"^unknown device 'gpu': choose one of auto, cpu, cuda$"):
        rank_device("gpu")
    assert rank_device(DeviceChoice.parse("cpu")) == torch.device("cpu")
    assert [choice.value for choice in DeviceChoice] == ["auto", "cpu", "cuda"]  # the order the message lists


@pytest.mark.skipif(CUDA, reason="checks the machine without CUDA")
def test_without_cuda_auto_is_the_cpu_and_cuda_is_refused() -> None:
    assert rank_device("auto", rank=3) == torch.device("cpu")
    message = r"^device cuda was asked for, but torch.cuda.is_available\(\) is False on this machine$"
    with pytest.raises(ValueError, match=message):
        rank_device("cuda")


def test_a_cpu_rank_makes_no_cuda_call(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("a CUDA call on a CPU rank")

    for name in ("is_available", "device_count", "set_device", "current_device", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, refuse)
    assert rank_device("cpu", rank=1) == torch.device("cpu")
    assert gpu_identity(torch.device("cpu")) == ""


def test_ranks_own_a_gpu_when_no_two_name_the_same_one() -> None:
    assert own_gpu(["node-a/GPU-1", "node-a/GPU-2", "node-b/GPU-1"])  # the same UUID on two hosts: two GPUs
    assert not own_gpu(["node-a/GPU-1", "node-a/GPU-2", "node-a/GPU-1"])  # two ranks on one GPU
    assert not own_gpu(["node-a/GPU-1", ""])  # a rank on the host
    assert not own_gpu([])


def test_to_device_reaches_tensors_inside_containers() -> None:
    value = (torch.ones(2), [torch.zeros(1), {"a": torch.arange(3)}], 7)
    moved = to_device(value, torch.device("cpu"))
    assert moved[2] == 7 and isinstance(moved[1], list) and isinstance(moved[1][1], dict)
    assert moved[0] is value[0]  # already there: not copied
