"""Parametrized modules ([Note: parametrized modules] in hintpipe.planner.fx_trace): a model with
``weight_norm`` and ``spectral_norm`` plans through torch.fx and torch.export, its plan travels to the ranks
(pickled), and its stages give the unsplit model's gradients and its spectral norm's power-iteration buffers.

Before, torch.fx kept a parametrized ``nn.Linear`` whole, and pickling the plan failed ("Serialization of
parametrized modules is only supported through state_dict()"); through torch.export, profiling ran backward from
a view the spectral norm makes under ``no_grad``, which has no graph ("element 0 of tensors does not require
grad").
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

from hintpipe.planner.buffer_updates import updated_buffer_spans
from hintpipe.planner.plan import plan


class Normed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = weight_norm(nn.Linear(6, 6))
        self.b = spectral_norm(nn.Linear(6, 6))
        self.c = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        out: torch.Tensor = self.c(torch.tanh(self.b(torch.tanh(self.a(x))))) * scale
        return out


def _microbatches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(5, 6, generator=g) for _ in range(3)]


def _model() -> Normed:
    torch.manual_seed(0)
    return Normed()


@pytest.mark.parametrize("capture", ["torch.fx", "torch.export"])
def test_a_parametrized_model_plans_travels_and_trains_as_the_unsplit_model(capture: str) -> None:
    kwargs = {"scale": 1.0} if capture == "torch.export" else None
    made = pickle.loads(pickle.dumps(plan(_model(), _microbatches()[0], ranks=2, microbatches=3, kwargs=kwargs)))
    first, second = made.build_stage(0), made.build_stage(1)
    reference = _model()
    for x in _microbatches():
        sent = first(x)
        second(*(sent if isinstance(sent, tuple) else (sent,))).sum().backward()
        reference(x).sum().backward()
    got = {name: p.grad for stage in (first, second) for name, p in stage.named_parameters()}
    got_buffers = {name: b for stage in (first, second) for name, b in stage.named_buffers()}
    expected = {name: p.grad for name, p in reference.named_parameters()}
    assert set(got) == set(expected) and "a.parametrizations.weight.original0" in got
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-6, atol=1e-7, msg=name)
    for name, value in reference.named_buffers():  # the spectral norm's _u and _v, one iteration per forward
        torch.testing.assert_close(got_buffers[name], value, rtol=1e-6, atol=1e-7, msg=name)


def test_the_spectral_norms_buffers_written_through_out_are_each_kept_in_one_stage() -> None:
    """torch.export writes the power iteration's vectors with ``aten.div.out(..., out=_u)``: the written
    argument is a keyword. Each buffer's span runs from its first read to the last read of what the write
    returned, the write inside it."""
    made = plan(_model(), _microbatches()[0], ranks=2, microbatches=3, kwargs={"scale": 1.0})
    spans = updated_buffer_spans(made.graph.module, made.graph.nodes)
    names = [n.name for n in made.graph.nodes]
    assert len(spans) == 2, names
    writes = [i for i, name in enumerate(names) if name.startswith("div_out")]
    assert sorted(next(i for i in writes if first < i < last) for first, last in spans) == writes, (spans, names)
