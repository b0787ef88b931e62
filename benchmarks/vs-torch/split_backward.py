"""What a split backward costs against the whole backward it replaces, on gpt-mini's last stage (4 blocks of
128 and the head, one row of 64 tokens): torch's ``stage_backward_input``/``stage_backward_weight`` and the
runtime's put-off weight gradients (``hintpipe.runtime.loop.weight_deferral``), and the forward each split needs
(the runtime's linear layers record what W will need). The three run alternately, every iteration, and each is
taken as a ratio to the unsplit forward and backward of its own iteration: the machine's drift between seconds
falls out of the ratio."""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from hintpipe.apps.models import ModelConfig, build_layers, split_layers
from hintpipe.runtime.loop.weight_deferral import WeightDeferral, defer_linear_weights

torch.set_num_threads(1)
cfg = ModelConfig(name="gpt-mini", layers=8, hidden=128, heads=4, vocab=256, max_seq_len=256)
plain = split_layers(build_layers(cfg), 2)[1]
theirs = copy.deepcopy(plain)
ours = copy.deepcopy(plain)
defer_linear_weights(ours)
deferral = WeightDeferral()
x0 = torch.randn(1, 64, 128)
tgt = torch.randint(0, 256, (64,))


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), tgt)


def whole() -> tuple[float, float, float]:
    """The unsplit stage: seconds of its forward, its backward, and no W."""
    x = x0.clone().requires_grad_()
    began = time.perf_counter()
    loss = loss_of(plain(x))
    middle = time.perf_counter()
    torch.autograd.backward(loss)
    return middle - began, time.perf_counter() - middle, 0.0


def torch_split() -> tuple[float, float, float]:
    x = x0.clone().requires_grad_()
    began = time.perf_counter()
    loss = loss_of(theirs(x))
    forward = time.perf_counter() - began
    began = time.perf_counter()
    _, groups = stage_backward_input([loss], None, [x], theirs.parameters())
    middle = time.perf_counter()
    stage_backward_weight(theirs.parameters(), groups)
    return forward, middle - began, time.perf_counter() - middle


def put_off() -> tuple[float, float, float]:
    x = x0.clone().requires_grad_()
    began = time.perf_counter()
    with deferral.active():
        loss = loss_of(ours(x))
    forward = time.perf_counter() - began
    collected: list[Callable[[], None]] = []
    began = time.perf_counter()
    with deferral.collecting(collected):
        torch.autograd.backward(loss)
    middle = time.perf_counter()
    for weight_gradients in collected:
        weight_gradients()
    return forward, middle - began, time.perf_counter() - middle


def main(iterations: int = 300) -> None:
    for _ in range(10):  # warm-up
        whole(), torch_split(), put_off()
    ratios: dict[str, list[tuple[float, float, float]]] = {"torch": [], "hintpipe": []}
    wholes = []
    for _ in range(iterations):
        forward, backward, _ = whole()
        wholes.append((forward, backward))
        for name, split in (("torch", torch_split), ("hintpipe", put_off)):
            f, b, w = split()
            ratios[name].append((f / forward, b / backward, w / backward))
    print(
        f"whole: forward {statistics.median(f for f, _ in wholes) * 1e3:.2f} ms, backward "
        f"{statistics.median(b for _, b in wholes) * 1e3:.2f} ms (medians)"
    )
    for name, triples in ratios.items():
        f = statistics.median(t[0] for t in triples)
        b = statistics.median(t[1] for t in triples)
        w = statistics.median(t[2] for t in triples)
        total = statistics.median(t[1] + t[2] for t in triples)
        print(
            f"{name}: forward {f:.2f} of the whole forward; B {b:.2f}, W {w:.2f}, B + W {total:.2f} of the whole "
            f"backward ({iterations} paired iterations)"
        )


if __name__ == "__main__":
    main()
