"""A training forward's random numbers belong to its task: [Note: a task's random numbers] in
``hintpipe.runtime.loop.task_seeds``. The masks of (stage, micro-batch) do not depend on the order the tasks ran
in, the caller's stream moves by one draw a step, and the generator is left as it was found."""

from __future__ import annotations

import torch
from torch import nn

from hintpipe.runtime.loop.executor import StageExecutor
from hintpipe.runtime.loop.task_seeds import TaskSeeds, task_seed

CPU = torch.device("cpu")


def _masks(seeds: TaskSeeds, order: list[tuple[int, int]]) -> dict[tuple[int, int], torch.Tensor]:
    out = {}
    for stage, mb in order:
        with seeds.seeded(stage, mb):
            out[(stage, mb)] = torch.rand(64)
    return out


def test_a_task_draws_the_same_numbers_in_any_order_and_the_callers_stream_moves_one_draw_a_step() -> None:
    torch.manual_seed(7)
    seeds = TaskSeeds(CPU)
    seeds.begin_step()
    in_order = _masks(seeds, [(0, 0), (0, 1), (1, 0), (1, 1)])
    after = torch.rand(3)

    torch.manual_seed(7)
    seeds = TaskSeeds(CPU)
    seeds.begin_step()
    reversed_ = _masks(seeds, [(1, 1), (0, 1), (1, 0), (0, 0)])
    assert all(torch.equal(in_order[key], reversed_[key]) for key in in_order)
    assert torch.equal(torch.rand(3), after)  # the tasks' draws left the caller's stream where it was

    torch.manual_seed(7)
    step_seed = int(torch.randint(2**63 - 1, (1,)).item())  # the step's one draw
    assert torch.equal(torch.rand(3), after)
    torch.manual_seed(task_seed(step_seed, 1, 0, replica=0))
    assert torch.equal(torch.rand(64), in_order[(1, 0)])


def test_stages_micro_batches_and_replicas_draw_apart_and_steps_draw_anew() -> None:
    torch.manual_seed(0)
    seeds = TaskSeeds(CPU)
    seeds.begin_step()
    first = _masks(seeds, [(0, 0), (0, 1), (1, 0)])
    seeds.begin_step()
    second = _masks(seeds, [(0, 0)])
    torch.manual_seed(0)  # another data-parallel replica, its generator seeded alike: its own masks
    other = TaskSeeds(CPU, replica=1)
    other.begin_step()
    replica = _masks(other, [(0, 0)])
    drawn = [first[(0, 0)], first[(0, 1)], first[(1, 0)], second[(0, 0)], replica[(0, 0)]]
    assert all(not torch.equal(a, b) for i, a in enumerate(drawn) for b in drawn[i + 1 :])


def test_a_stage_executors_dropout_is_its_tasks_own() -> None:
    # The executor seeds each training forward; two executors running one step's forwards in other orders give
    # each micro-batch the same dropout mask (a ready policy runs them in whatever order messages allow).
    def run(order: list[int]) -> dict[int, torch.Tensor]:
        torch.manual_seed(3)
        executor = StageExecutor(
            {0: nn.Dropout(0.5)}, last_stage=1, loss_fn=lambda out, target: out.sum(), split_backward=False,
            seeds=TaskSeeds(CPU),
        )  # fmt: skip
        executor.begin_step(0)
        out = {mb: executor.forward(0, mb, [torch.ones(32, requires_grad=True)], None, 1.0)[0][0] for mb in order}
        assert all(isinstance(t, torch.Tensor) for t in out.values())
        return {mb: torch.as_tensor(t) for mb, t in out.items()}

    one, other = run([0, 1, 2]), run([2, 0, 1])
    assert all(torch.equal(one[mb], other[mb]) for mb in range(3))
    assert not torch.equal(one[0], one[1])


def test_the_step_seed_is_drawn_on_the_cpu_whatever_the_default_device() -> None:
    # Under torch.set_default_device("cuda") the draw would come from the GPU's generator and reading it would
    # wait for the GPU every step; "meta" stands for it here (a draw there has no value to read at all).
    torch.manual_seed(1)
    step_seed = int(torch.randint(2**63 - 1, (1,)).item())
    torch.manual_seed(1)
    seeds = TaskSeeds(CPU)
    with torch.device("meta"):
        seeds.begin_step()
    with seeds.seeded(0, 0):
        drawn = torch.rand(8)
    torch.manual_seed(task_seed(step_seed, 0, 0))
    assert torch.equal(drawn, torch.rand(8))
