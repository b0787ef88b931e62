"""Injection wrappers: the delayed transport and the varied executor, on fakes (no processes)."""

from __future__ import annotations

import math
import queue
import time
import types
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from hintpipe.dispatch.variability import CommDelay
from hintpipe.runtime import faults
from hintpipe.runtime.faults import DelayedTransport, FaultyExecutor, VariedExecutor
from hintpipe.runtime.injection import Injection
from hintpipe.runtime.loop.emulated import EmulatedCosts, EmulatedExecutor
from hintpipe.runtime.loop.executor import Tensors
from hintpipe.runtime.transport.wire import Message, MessageKind, Value
from hintpipe.schedule.task import Kind


class _Inbox:
    """A transport whose messages are put in by the test."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Message] = queue.Queue()

    def put(self, peer: int, mb: int) -> None:
        self.queue.put(Message(MessageKind.ACTIVATION, 0, 1, mb, [], peer, time.perf_counter()))

    def get(self, timeout: float | None) -> Message | None:
        try:
            return self.queue.get(timeout=timeout) if timeout else self.queue.get_nowait()
        except queue.Empty:
            return None

    def send(self, peer: int, kind: MessageKind, step: int, stage: int, mb: int, tensors: Sequence[Value]) -> None:
        raise AssertionError("not used")

    def notify(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        raise AssertionError("not used")

    def ask(self, peer: int, step: int, stage: int, mb: int, of: MessageKind) -> None:
        raise AssertionError("not used")

    def flush(self, timeout: float) -> None:
        pass

    def close(self, timeout: float = 30.0, error: str | None = None) -> None:
        pass


def test_delayed_messages_arrive_no_earlier_than_the_latency_and_in_order_per_peer() -> None:
    inner = _Inbox()
    transport = DelayedTransport(inner, CommDelay(0.05, 0.05, in_seconds=True), seed=3)
    for mb in range(6):
        inner.put(peer=mb % 2, mb=mb)
    sent = time.perf_counter()
    assert transport.get(0) is None  # nothing is due yet
    got: list[tuple[int, int, float]] = []
    while len(got) < 6:
        msg = transport.get(5.0)
        assert msg is not None
        got.append((msg.peer, msg.mb, time.perf_counter() - sent))
    assert all(elapsed >= 0.05 for _, _, elapsed in got)
    for peer in (0, 1):
        assert [mb for p, mb, _ in got if p == peer] == [mb for mb in range(6) if mb % 2 == peer]


class _Timed:
    """An executor whose every task computes for ``seconds`` of CPU time, then waits ``waits`` seconds without
    computing (as a tensor-parallel task waits in a collective for the other members)."""

    live_bytes = 0

    def __init__(self, seconds: float, waits: float = 0.0) -> None:
        self.seconds = seconds
        self.waits = waits

    def begin_step(self, step: int) -> None:
        pass

    def _task(self) -> None:
        began = time.thread_time()
        while time.thread_time() - began < self.seconds:
            pass
        time.sleep(self.waits)

    def forward(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        self._task()
        return [], None

    def backward(self, stage: int, mb: int, grads: Tensors | None) -> Tensors:
        self._task()
        return []

    def weight(self, stage: int, mb: int) -> None:
        self._task()

    def evaluate(
        self, stage: int, mb: int, inputs: Sequence[Value], target: Any, loss_scale: float
    ) -> tuple[list[Value], torch.Tensor | None]:
        return self.forward(stage, mb, inputs, target, loss_scale)


def _padding(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """What the varied executor asks to sleep, recorded instead of slept: read in CPU seconds, the padding does
    not depend on how loaded the machine is (the tasks' own compute and waits run as they are)."""
    asked: list[float] = []
    clock = types.SimpleNamespace(thread_time=time.thread_time, perf_counter=time.perf_counter, sleep=asked.append)
    monkeypatch.setattr(faults, "time", clock)
    return asked


def test_real_compute_is_slowed_by_the_factor_and_never_sped_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # straggler:4:0 makes stage 0's tasks cost 4x: a task that computed 20 ms sleeps 60 ms more.
    asked = _padding(monkeypatch)
    factors = Injection.parse(["straggler:4:0:0:0"]).factors(stages=2, microbatches=2)
    executor = VariedExecutor(_Timed(0.02), factors)
    executor.forward(0, 0, [], None, 1.0)
    assert len(asked) == 1 and asked[0] >= 0.06
    executor.forward(1, 0, [], None, 1.0)  # factor 1 on stage 1: as it is
    assert len(asked) == 1


def test_real_compute_is_padded_by_its_computation_not_its_wait_for_other_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A task that computed 10 ms and then waited 200 ms for its tensor-parallel partner costs 4 x 10 ms under
    # straggler:4: it sleeps 30 ms more, not 3 x 210 ms (which fed every partner's padding into the next task).
    asked = _padding(monkeypatch)
    factors = Injection.parse(["straggler:4:0:0:0"]).factors(stages=2, microbatches=2)
    executor = VariedExecutor(_Timed(0.01, waits=0.2), factors)
    executor.forward(0, 0, [], None, 1.0)
    assert len(asked) == 1 and 0.03 <= asked[0] < 0.3  # padded by the 210 ms of wall time: 0.63 s


def test_emulated_compute_takes_the_factor_exactly() -> None:
    costs = EmulatedCosts((0.01, 0.01), (0.03, 0.03), (0.0, 0.0), reference_size=4)
    executor = EmulatedExecutor(costs, last_stage=1, factor=lambda step, stage, kind, mb: 0.5 if mb == 1 else 2.0)
    assert executor.duration(0, Kind.F, 0, 4) == pytest.approx(0.02)
    assert executor.duration(0, Kind.F, 1, 8) == pytest.approx(0.01)  # twice the reference size, factor 0.5
    assert executor.duration(1, Kind.B, 1, 4) == pytest.approx(0.015)
    # The first stage's input size travels down the pipeline as a one-element activation.
    outputs, _ = executor.forward(0, 3, [torch.zeros(2, 6)], None, 1.0)
    assert isinstance(outputs[0], torch.Tensor) and outputs[0].tolist() == [12.0]


def test_emulated_costs_scale_every_task_and_keep_their_sizes() -> None:
    costs = EmulatedCosts((0.01, 0.02), (0.03, 0.04), (0.0, 0.05), reference_size=4, sized_by=(0, 0), references=(4,))
    scaled = costs.scaled(2.0)
    assert (scaled.forward, scaled.backward, scaled.weight) == ((0.02, 0.04), (0.06, 0.08), (0.0, 0.1))
    assert (scaled.reference_size, scaled.sized_by, scaled.references) == (4, (0, 0), (4,))


def test_a_fault_wrapper_passes_the_step_on_to_the_executor_it_wraps() -> None:
    # Emulated compute draws each task's factor by step: under a fault wrapper it must still see the step.
    costs = EmulatedCosts((0.01,), (0.01,), (0.0,), reference_size=4)
    executor = EmulatedExecutor(costs, last_stage=0, factor=lambda step, stage, kind, mb: 1.0 + step)
    wrapped = FaultyExecutor(executor, Injection.parse(faults=["nan:9"]), rank=0)
    wrapped.begin_step(3)
    assert (wrapped.step, executor.step) == (3, 3)
    assert executor.duration(0, Kind.F, 0, 4) == pytest.approx(0.04)


def test_multimodal_factors_split_encoder_and_decoder_stages() -> None:
    # mm:0.8:0.4:0.25:1 on 8 stages: stages 0-1 are the encoder, 2-7 the decoder; with rho = 1
    # both factors come from one normal draw z: f = exp(sigma z - sigma^2 / 2).
    factors = Injection.parse(["mm:0.8:0.4:0.25:1"], seed=3).factors(stages=8, microbatches=6)
    for step, mb in [(0, 0), (0, 5), (2, 3)]:
        encoder = {factors(step, s, kind, mb) for s in (0, 1) for kind in (Kind.F, Kind.B, Kind.W)}
        decoder = {factors(step, s, kind, mb) for s in range(2, 8) for kind in (Kind.F, Kind.B, Kind.W)}
        assert len(encoder) == len(decoder) == 1  # one factor per part and micro-batch
        z_encoder = (math.log(encoder.pop()) + 0.5 * 0.8**2) / 0.8
        z_decoder = (math.log(decoder.pop()) + 0.5 * 0.4**2) / 0.4
        assert z_encoder == pytest.approx(z_decoder)
    assert factors(0, 0, Kind.F, 0) != factors(0, 0, Kind.F, 1) != factors(1, 0, Kind.F, 1)


def test_multimodal_factors_have_mean_one_in_both_parts() -> None:
    factors = Injection.parse(["mm:0.5:0.5"], seed=1).factors(stages=4, microbatches=1)
    encoder = [factors(step, 0, Kind.F, 0) for step in range(4000)]
    decoder = [factors(step, 3, Kind.F, 0) for step in range(4000)]
    # the standard error of a mean of 4000 lognormal(0.5) draws is about 0.008
    assert sum(encoder) / 4000 == pytest.approx(1.0, abs=0.04)
    assert sum(decoder) / 4000 == pytest.approx(1.0, abs=0.04)
    assert encoder != decoder  # rho 0: independent draws


def test_emulated_stages_can_be_sized_by_different_inputs() -> None:
    # A vision-language model: stage 0 costs with the images (input 0), stage 1 with the text (input 1).
    costs = EmulatedCosts((0.01, 0.02), (0.0, 0.0), (0.0, 0.0), reference_size=8, sized_by=(0, 1), references=(8, 4))
    executor = EmulatedExecutor(costs, last_stage=1)
    assert executor.duration(0, Kind.F, 0, [16.0, 4.0]) == pytest.approx(0.02)  # twice the images
    assert executor.duration(1, Kind.F, 0, [16.0, 4.0]) == pytest.approx(0.02)  # the reference text
    assert executor.duration(1, Kind.F, 0, [8.0, 2.0]) == pytest.approx(0.01)  # half the text
    outputs, _ = executor.forward(0, 0, [torch.zeros(2, 8), torch.zeros(3)], None, 1.0)
    assert isinstance(outputs[0], torch.Tensor) and outputs[0].tolist() == [16.0, 3.0]  # both sizes go down
    with pytest.raises(ValueError, match=r"^sized_by names an input for 1 stages, not 2$"):
        EmulatedCosts((0.01, 0.02), (0.0, 0.0), (0.0, 0.0), reference_size=8, sized_by=(0,), references=(8, 4))
