"""Random numbers that belong to a task, not to the moment it ran.

[Note: a task's random numbers]
Dropout draws its masks from torch's default generator, in the order the
forwards run. Under a fixed order that order is the hint's; under ``ready`` it
is whatever the messages allowed, so the same seed gave other masks to other
micro-batches from run to run, and a resumed run drew other masks than the
run it continued (measured: a Hugging Face GPT-2 with dropout 0.1, two runs of
one plan file with one seed, step 1's loss 5.5127 and 5.5078). And every rank
drew from one stream: two stages' masks for one micro-batch were the same
bits wherever their shapes matched.

So each training forward runs on the default generators (the CPU's and the
rank's GPU's) seeded from ``(step seed, data-parallel replica, stage,
micro-batch)``, and puts them back as they were after it. The replica keeps
two replicas' masks apart (they train other rows, as the unsplit model's
samples each get their own mask); the members of a tensor-parallel group share
it, and draw alike, as they must where their values are replicated. The step
seed is one draw from the rank's own default (CPU) generator at the start of
each training step: a caller's ``torch.manual_seed`` still decides every mask,
a checkpoint that keeps the rank's generator state (hintpipe's do) resumes
with the same masks, and the step moves the caller's
stream by that one draw only, whatever its stages draw. A backward that
recomputes a forward (``torch.utils.checkpoint``) replays the forward's state,
as it does without a pipeline. Evaluations are not seeded: they draw nothing
in eval mode, and a caller's extra evaluation then moves nothing. Seeding and
putting back cost about 5 us a forward on a CPU.

The masks depend on the stage a layer is in: another cut of the model (a plan
measured afresh, another ``ranks``) or another ``dp`` draws other masks, as the
unsplit model's masks differ from any pipeline's.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
from collections.abc import Iterator

import torch

#: Seeds are taken below 2**63: ``torch.Generator.manual_seed`` takes any 64-bit value, ``torch.randint`` draws
#: below its ``high``.
_SEEDS = 2**63 - 1


class TaskSeeds:
    """The default generators seeded per task (see [Note: a task's random numbers]), on ``device``'s generator
    and the CPU's, for the data-parallel ``replica`` (the rank's ``dp`` coordinate)."""

    def __init__(self, device: torch.device, replica: int = 0) -> None:
        self.device = device
        self.replica = replica
        self._step_seed = 0

    def begin_step(self) -> None:
        """Draw this step's seed from the rank's default CPU generator (its one draw a step; on the CPU whatever the
        default device, so that reading it never waits for a GPU)."""
        self._step_seed = int(torch.randint(_SEEDS, (1,), device="cpu", generator=torch.default_generator).item())

    @contextlib.contextmanager
    def seeded(self, stage: int, mb: int) -> Iterator[None]:
        """Run the body on generators seeded for ``(stage, mb)`` of this step; they are put back after it."""
        seed = task_seed(self._step_seed, stage, mb, self.replica)
        cuda = self.device.type == "cuda"
        cpu_state = torch.default_generator.get_state()
        device_state = torch.cuda.get_rng_state(self.device) if cuda else None
        torch.default_generator.manual_seed(seed)
        if cuda:
            torch.cuda.default_generators[_index(self.device)].manual_seed(seed)
        try:
            yield
        finally:
            torch.default_generator.set_state(cpu_state)
            if device_state is not None:
                torch.cuda.set_rng_state(device_state, self.device)


def task_seed(step_seed: int, stage: int, mb: int, replica: int = 0) -> int:
    """The seed of ``(stage, mb)`` of data-parallel ``replica`` in a step seeded ``step_seed``: a hash, so that
    nearby tasks' seeds share no structure."""
    digest = hashlib.blake2b(struct.pack("<Qqqq", step_seed, replica, stage, mb), digest_size=8).digest()
    return int.from_bytes(digest, "little") & _SEEDS


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
