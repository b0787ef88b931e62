"""[Note: a probe leaves the model as it was]: the planner's runs of the user's model outside training put back
what the model changed of itself, so that a capture made after one traces the model as the user gave it."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from conftest import raised_here
from hintpipe.planner.buffer_updates import written_parameters
from hintpipe.planner.capture import ParameterWriteWarning, capture
from hintpipe.planner.mode_check import EvalModeWarning
from hintpipe.planner.plan import plan
from hintpipe.planner.state_kept import state_kept


class Rescaled(nn.Module):
    """RWKV's habit, small: in eval mode its forward divides a weight in place and says so in a flag; back in
    train mode, its next forward multiplies the weight back (``RwkvModel._rescale_layers``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(4, 8)
        self.second = nn.Linear(8, 4)
        self.rescaled = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training == self.rescaled:
            with torch.no_grad():
                if self.training:
                    self.second.weight.mul_(2.0)
                else:
                    self.second.weight.div_(2.0)
            self.rescaled = not self.training
        out: torch.Tensor = self.second(torch.tanh(self.first(x)))
        return out


def test_a_run_in_eval_mode_leaves_the_weights_and_the_flags_as_they_were() -> None:
    model = Rescaled()
    weight = model.second.weight.detach().clone()
    model.eval()
    with torch.no_grad(), state_kept(model):
        model(torch.ones(2, 4))
        assert model.rescaled and torch.equal(model.second.weight, weight / 2)  # the run saw its own change
    assert not model.rescaled and torch.equal(model.second.weight, weight)


def test_a_run_puts_back_written_buffers_and_drops_attributes_it_added() -> None:
    model = nn.BatchNorm1d(3)
    mean = torch.zeros(3)
    with state_kept(model):
        model(torch.randn(4, 3) + 5.0)
        model.cache = torch.zeros(1)  # what a forward might leave
    assert torch.equal(model.get_buffer("running_mean"), mean)
    assert int(model.get_buffer("num_batches_tracked")) == 0
    assert not hasattr(model, "cache")


def test_a_capture_after_another_traces_the_model_as_given() -> None:
    """Before, the first capture's eval-mode check left the weight halved and the flag set, and the second
    capture traced the way back, ``mul_(2)``, into the graph: every stage forward doubled the weight again."""
    model = Rescaled()
    weight = model.second.weight.detach().clone()
    example = (torch.ones(2, 4),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EvalModeWarning)  # it does compute otherwise in eval mode, as RWKV does
        warnings.simplefilter("error", ParameterWriteWarning)
        for _ in range(2):
            captured = capture(model, example=example)
            assert written_parameters(captured.module) == []
    assert not model.rescaled and torch.equal(model.second.weight, weight)


def test_a_planned_stage_runs_two_forwards_before_their_backwards() -> None:
    """The schedule every pipeline has on its first stage (F0 F1 B0 B1), which a graph that writes its weights
    in place fails (``modified by an inplace operation``); the gradients are the unsplit model's."""
    model = Rescaled()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        capture(model, example=(torch.ones(2, 4),))  # as a folder's check runs it first, in eval mode
        planned = plan(model, torch.ones(2, 4), ranks=1, microbatches=2, repeats=1)
    stage = planned.build_stage(0)
    inputs = [torch.randn(2, 4, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    outputs = [stage(x) for x in inputs]
    for out in outputs:
        out.sum().backward()
    reference = Rescaled()
    sum(reference(x).sum() for x in inputs).backward()
    got = {name.replace(".", "_"): parameter for name, parameter in stage.named_parameters()}
    for name, parameter in reference.named_parameters():
        match = next(p for n, p in got.items() if n.endswith(name.replace(".", "_")))
        torch.testing.assert_close(match.grad, parameter.grad, rtol=1e-6, atol=1e-7)


class Clipped(nn.Module):
    """A forward that writes its own weight while training, as no pipeline can run it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.inner.weight.clamp_(-1.0, 1.0)
        out: torch.Tensor = self.inner(x)
        return out


def test_a_forward_that_writes_its_parameters_is_said() -> None:
    with pytest.warns(ParameterWriteWarning) as caught:
        capture(Clipped(), example=(torch.ones(2, 4),))
    assert [str(w.message) for w in raised_here(caught)] == [
        "Clipped's forward writes its parameters in place while training (inner.weight): a stage runs several "
        "micro-batches' forwards before their backwards, and a backward that saved such a parameter fails (modified "
        "by an inplace operation); change them outside forward, between steps"
    ]
