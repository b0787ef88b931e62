"""The GPU check's sizes per device and what every check (and every spawned rank) is handed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from report import Result
from throughput import Throughput

from hintpipe.apps.models import ModelConfig, SeqLenDist

REPO = Path(__file__).resolve().parents[2]
#: A spawned group's limit: a collective or a transfer stuck this long fails instead of hanging the check.
GROUP_TIMEOUT_S = 90.0
#: A command line check's limit.
COMMAND_TIMEOUT_S = 180.0
#: ``train --check-grads``'s largest relative difference allowed (tests/apps/test_train.py's on CPU).
CHECK_GRADS_REL = {"cpu": 1e-5, "cuda": 1e-4}


# -- sizes ----------------------------------------------------------------------------------------------

#: Check 12 on CUDA: the slow run's flags as the project's issue quotes them (``--device``, the hint, the policy,
#: the precision and the room are the check's), a few steps.
SLOW_TRAIN = (
    *("--model", "gpt-mini", "--layers", "4", "--hidden", "256", "--ranks", "2", "--microbatches", "8"),
    *("--seq-len-dist", "lognormal:128:0.5", "--steps", "4"),
)


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Model and run sizes per device: small for a dry run on a 2-core CPU beside a test suite, big enough on a
    GPU that the figures are not all launch overhead, and all of it within 5 minutes there."""

    model: ModelConfig  # checks 1, 2, 3-4 (its layers and hidden), 5
    microbatch_size: int
    seq: SeqLenDist
    plan_model: ModelConfig  # check 5 and the memory table
    plan_seq_len: int
    throughput: Throughput
    repeats: int
    slow_train: tuple[str, ...]  # check 12: ``hintpipe train``'s model and batch flags
    microbatches: int = 4


def sizes_for(device: str) -> Sizes:
    if device == "cuda":
        model = ModelConfig("gpt-mini", layers=4, hidden=256, heads=8, vocab=512, max_seq_len=257)
        plan_model = ModelConfig("gpt-mini", layers=8, hidden=256, heads=8, vocab=256, max_seq_len=257)
        throughput_model = ModelConfig("gpt-mini", layers=8, hidden=512, heads=8, vocab=1024, max_seq_len=513)
        throughput = Throughput(device, throughput_model, 8, 8, 256, 4)
        return Sizes(model, 4, SeqLenDist(128, 0.5), plan_model, 256, throughput, 5, SLOW_TRAIN)
    model = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=33)
    throughput_model = ModelConfig("gpt-mini", layers=2, hidden=32, heads=2, vocab=64, max_seq_len=65)
    throughput = Throughput(device, throughput_model, 4, 2, 32, 2)
    slow_train = (
        *("--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2", "--microbatches", "4"),
        *("--microbatch-size", "2", "--seq-len-dist", "lognormal:16:0.5", "--steps", "2"),
    )
    return Sizes(model, 2, SeqLenDist(16, 0.5), model, 32, throughput, 2, slow_train)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every check (and every spawned rank) needs to know."""

    device: str  # "cuda" or "cpu"
    sizes: Sizes


Check = Callable[[Setup, Result], None]
