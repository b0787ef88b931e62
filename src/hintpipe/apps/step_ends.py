"""Each micro-batch's work at the pipeline's two ends, for ``microbatch_order="front-then-back"``.

That order (see [Note: front then back] in :mod:`hintpipe.schedule.microbatch_order`) ranks micro-batches by
their work at the first stage and at the last; the runtime reads them from ``Pipeline.step(ends=...)``, and
without them takes each micro-batch's input elements for both, which makes the order shortest-first. The
built-in models know their two ends:

- ``mm-mini``: its first stage runs the vision encoder, whose work follows the micro-batch's image patches;
  its last stage runs the language decoder and head, whose work follows its text tokens. The two are drawn
  independently, so the order differs from shortest-first.
- the language models (``gpt-mini``, ``hf-gpt2``, ``hf-llama``, formed or not): a stack of like blocks, every
  stage's work following the micro-batch's token positions (padding included), the same at both ends.
- ``mlp``: its rows, at both ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hintpipe.apps.model_spec import MODEL_SPECS, ModelSpec


def microbatch_ends(model: ModelSpec | str, inputs: Sequence[Any]) -> tuple[list[float], list[float]]:
    """Per micro-batch of ``inputs`` (one step's, in the given order), its work at the first stage and at the
    last, in the elements each end's cost follows (:mod:`module docs <hintpipe.apps.step_ends>`), as the model's
    kind (its spec, or a built-in's name) says: a micro-batch of several tensors (``mm-mini``) by its first at
    the first stage (rows x patches) and its last at the last; rows for a model of samples; else positions."""
    spec = model if isinstance(model, ModelSpec) else MODEL_SPECS[model]
    first: list[float] = []
    last: list[float] = []
    for given in inputs:
        if spec.inputs > 1:
            front, back = given[0], given[-1]
            first.append(float(front.shape[0] * front.shape[1]))
            last.append(float(back.numel()))
            continue
        ids = given[0] if isinstance(given, tuple) else given  # packed rows: (ids, documents)
        assert isinstance(ids, torch.Tensor)
        work = float(ids.shape[0] if spec.unit == "samples" else ids.numel())
        first.append(work)
        last.append(work)
    return first, last
