"""What the ranks agree on after a step: the measured costs (the ``ready`` forecast) and non-finite losses.

[Note: collectives per step]
A step's only collectives are the ones something needs: the sizes for byte
admission, the all-reduce of measured costs when the ``ready`` forecast looks at
them (after steps 0, 1, 3, 7, ..., then every 16) or of non-finite losses
(``on_nonfinite="skip"``), the sum of tied gradients, the report's gather
(``report_every``), the loss broadcast (``broadcast_loss``). Otherwise
ranks are coupled only by their messages, and a hang is still caught by
the watchdog.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hintpipe.dispatch.expected import stage_medians
from hintpipe.dispatch.policy import Policy
from hintpipe.modes import OnNonFinite
from hintpipe.runtime.errors import NonFiniteLoss, WatchdogTimeout
from hintpipe.runtime.loop.hooks import Hook
from hintpipe.runtime.loop.ready_forecast import ReadyForecaster
from hintpipe.runtime.loop.reports import RankSummary, durations_array
from hintpipe.schedule.hint import Hint

if TYPE_CHECKING:
    from hintpipe.runtime.loop.step_state import StepState

log = logging.getLogger(__name__)


class Agreement(Hook):
    """The end of a step's agreement between the ranks of one pipeline (a step hook).

    Args:
        hint: the schedule.
        rank: this rank's position in its pipeline.
        policy: the pipeline's policy (``ready`` agrees on measured costs).
        coll: the pipeline's group for the runtime's collectives.
        timeout: the watchdog's seconds (``coll`` waits that long), for the error that names them.
        modules: this rank's stages (a skipped step's gradients are dropped from them).
        forecaster: the ``ready`` policy's forecast, refreshed from the agreed costs.
        on_nonfinite: what a non-finite loss does.
    """

    def __init__(
        self,
        hint: Hint,
        rank: int,
        policy: Policy,
        *,
        coll: dist.ProcessGroup,
        timeout: float,
        modules: Mapping[int, nn.Module],
        forecaster: ReadyForecaster,
        on_nonfinite: OnNonFinite,
    ) -> None:
        self.hint = hint
        self.rank = rank
        self.policy = policy
        self.coll = coll
        self.timeout = timeout
        self.modules = modules
        self.forecaster = forecaster
        self.on_nonfinite = on_nonfinite
        #: Steps that had a non-finite loss (their gradients were dropped under ``skip``).
        self.nonfinite_steps: list[int] = []
        self._order: list[int] = []
        self._step = 0

    def begin_step(self, state: StepState) -> None:
        self._order = state.order
        self._step = state.step

    def check_losses(self, losses: Sequence[torch.Tensor], slots: Sequence[int]) -> None:
        """The last stage's losses of the step, of the micro-batches in ``slots`` (in the order they ran):
        a non-finite one is recorded, and raises unless the step is to be skipped.

        [Note: one look at the losses per step]
        Reading a GPU's number on the host waits for every kernel queued before it: a check after each
        forward would hold the host one task behind the device, micro-batch after micro-batch. So the
        step's losses are checked together, on the device, once the last of them is computed (the step
        loop calls this after the last stage's last forward), and the host reads one flag. The
        neighbours are still in the step then (they wait for that micro-batch's gradient), so a raise
        still reaches them as the failing rank's own words.
        """
        stacked = torch.stack(list(losses))
        if bool(torch.isfinite(stacked).all()):  # the step's one wait for it
            return
        values = stacked.tolist()
        first = next(i for i, v in enumerate(values) if not math.isfinite(v))
        step, mb = self._step, self._order[slots[first]]
        self.nonfinite_steps.append(step)
        if self.on_nonfinite is OnNonFinite.RAISE:
            raise NonFiniteLoss(
                f"rank {self.rank}: the loss of micro-batch {mb} in step {step} is {values[first]}; the step "
                "stops before the optimizer runs (on_nonfinite='skip' finishes it and zeroes the gradients)"
            )

    def end_step(self, state: StepState) -> None:
        ready = self.policy is Policy.READY
        if not (self.on_nonfinite is OnNonFinite.SKIP or (ready and self.forecaster.due(state.step))):
            return
        medians, poisoned = self._agree(state)
        if poisoned:
            self._drop_gradients(state.step)
        if ready:
            self.forecaster.update(state.step, medians)

    def _agree(self, state: StepState) -> tuple[np.ndarray[Any, np.dtype[np.float64]], bool]:
        """One all-reduce: every stage's median costs (each rank fills its own) and any non-finite loss.

        It is also where the ranks meet between steps: a rank that never gets here is waited for
        at most the watchdog's timeout.
        """
        hint = self.hint
        own = stage_medians(durations_array(hint, [RankSummary.of(state, hint.split_backward, self.rank)]))
        flagged = state.step in self.nonfinite_steps
        values = torch.from_numpy(np.concatenate([own.reshape(-1), [1.0 if flagged else 0.0]]))
        try:
            dist.all_reduce(values, group=self.coll)
        except RuntimeError as exc:
            raise WatchdogTimeout(
                f"rank {self.rank}: waited {self.timeout:g} s for the other ranks to finish step {state.step}: {exc}"
            ) from None
        result = values.numpy()
        return result[:-1].reshape(hint.stages, 3), bool(result[-1] > 0)

    def _drop_gradients(self, step: int) -> None:
        """on_nonfinite="skip": the whole step's gradients are poisoned; drop them everywhere."""
        if step not in self.nonfinite_steps:
            self.nonfinite_steps.append(step)
        for module in self.modules.values():
            for param in module.parameters():
                param.grad = None
        log.warning("rank %d: step %d had a non-finite loss; its gradients were zeroed", self.rank, step)
