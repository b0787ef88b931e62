"""Whether a capture computes in eval mode what its model does.

[Note: a branch on self.training]
A model is captured in train mode, as a pipeline trains it. An operator that takes the mode as an argument
(``F.dropout(x, p, self.training)``, an attention's ``dropout_p``) follows each stage's own mode afterwards
([Note: operators that follow their module] in :mod:`hintpipe.planner.portable`), but a branch in Python
(``if self.training: x = drop_path(x)``, a router's noise) is decided while tracing: the stages run the training
branch in ``Pipeline.eval_step`` too. Nothing in the graph shows such a branch, so the model and its capture are
both run once in eval mode on the example (no gradients; the random state, every module's mode, and the tensors
and attributes the run changed put back: [Note: a probe leaves the model as it was] in
:mod:`hintpipe.planner.state_kept`), and a difference is said in a warning, with the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hintpipe.planner.state_kept import state_kept
from hintpipe.tensor_bytes import tensors_in

__all__ = ["EvalModeWarning", "warn_if_eval_differs"]

#: How far apart the two runs may be before they differ: more than the order of operations moves a float32 value
#: (torch.export's decompositions), far less than a branch does.
RELATIVE_TOLERANCE = 1e-3


class EvalModeWarning(UserWarning):
    """A captured model computes otherwise in eval mode than the model does (see [Note: a branch on
    self.training])."""


def warn_if_eval_differs(
    model: nn.Module, captured: nn.Module, example: tuple[Any, ...], kwargs: dict[str, Any]
) -> float | None:
    """Run ``model`` and its capture ``captured`` in eval mode on ``example`` and warn (:class:`EvalModeWarning`)
    where their outputs differ; the largest relative difference, or None where they cannot be compared (the
    example does not run them; another number of tensors or another shape: the capture returns the model's
    tensors flattened)."""
    inputs = (*example, *(v for v in kwargs.values() if isinstance(v, torch.Tensor)))
    devices = sorted({t.device.index or 0 for t in tensors_in(list(inputs)) if t.device.type == "cuda"})
    try:
        with _in_eval(model), _in_eval(captured), torch.random.fork_rng(devices=devices), torch.no_grad():
            want = tensors_in(model(*example, **kwargs))
            got = tensors_in(captured(*inputs))
    except Exception:  # an example that runs neither (an input left out, a model on meta): nothing to compare
        return None
    if len(want) != len(got) or any(a.shape != b.shape for a, b in zip(want, got, strict=True)):
        return None
    difference = max((_relative(a, b) for a, b in zip(want, got, strict=True)), default=0.0)
    if difference > RELATIVE_TOLERANCE:
        warnings.warn(
            f"{type(model).__name__} computes other values in eval mode than its capture does (largest relative "
            f"difference {difference:.3g} on the example): its forward branches on self.training in Python (a "
            "drop path, a router's noise), which the capture decides in train mode, so Pipeline.eval_step runs the "
            "training branch. Evaluate the unsplit model on the trained weights (the stages' state_dict or "
            "hintpipe.load_merged), or pass the mode to an operator (F.dropout(x, p, self.training)), which a "
            "stage follows",
            EvalModeWarning,
            stacklevel=3,
        )
    return difference


@contextmanager
def _in_eval(module: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in module.modules()]
    try:
        with state_kept(module):
            module.eval()
            yield
    finally:
        for m, training in modes:
            m.training = training


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    if not (a.is_floating_point() or a.is_complex()):
        return 0.0 if torch.equal(a, b) else float("inf")
    a, b = a.double(), b.double()
    scale = max(float(a.abs().max()) if a.numel() else 0.0, 1e-30)
    return float((a - b).abs().max()) / scale if a.numel() else 0.0
