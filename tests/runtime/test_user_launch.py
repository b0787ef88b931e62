"""Ranks started the way users start them: their own ``torch.multiprocessing`` spawn, with a plan or stage
modules passed as arguments.

torch's spawning moves the tensors of a process's arguments into shared memory, so without care every rank
trains one and the same storage: a tied weight is updated twice, data-parallel replicas train one copy. Each
rank must own what it trains. The model is transformers' GPT-2 (its embedding tied to the LM head), as it
is and wrapped in a user's own module; trained 3 steps with SGD and with AdamW, on 2 ranks and on DP 2 x PP 2;
every parameter is compared with the unsplit model trained on the same micro-batches (rtol 1e-4, atol 1e-5:
float32 sums in another order; AdamW with eps 1e-4, as in test_hf_models), and the tied copies on the first and
last stages must be bitwise equal. One spawn per world size runs every case.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import transformers
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.multiprocessing.spawn import spawn

from conftest import allow
from hintpipe import Pipeline, Plan, TiedParameter, plan
from hintpipe.runtime.launch import free_port

VOCAB = 64
RTOL, ATOL = 1e-4, 1e-5
STEPS = 3
MICROBATCHES = 4


def _gpt2() -> nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    model: nn.Module = transformers.GPT2LMHeadModel(config)
    return model


class UserModel(nn.Module):
    """A user's own module around the Hugging Face model: it returns the logits alone."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = _gpt2()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.gpt(ids, use_cache=False).logits
        return logits


def _logits(output: Any) -> torch.Tensor:
    logits: torch.Tensor = output if isinstance(output, torch.Tensor) else output.logits
    return logits


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _steps(replica: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(10 + replica)
    steps = []
    for _ in range(STEPS):  # variable lengths per micro-batch
        ids = [torch.randint(0, VOCAB, (2, n + 1), generator=g) for n in (5, 11, 8, 3)]
        steps.append(([x[:, :-1] for x in ids], [x[:, 1:] for x in ids]))
    return steps


def _optimizer(params: Any, name: str) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.5)
    return torch.optim.AdamW(params, lr=0.01, eps=1e-4)


Case = tuple[str, Plan, str, bool]  # (name, plan, optimizer, whether its stages travel as modules)


def _rank(rank: int, world: int, port: int, cases: list[Case], folder: str) -> None:
    """What a user's spawned rank does: join the group, then train each case's plan (a spawn argument)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results: dict[str, Any] = {}
    for name, planned, optimizer_name, as_modules in cases:
        shared = sum(t.untyped_storage().is_shared() for t in planned.graph.module.parameters())
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp")) if world == 4 else None
        if as_modules:  # the stage modules themselves were spawn arguments, beside the plan they came from
            stages = [planned.build_stage(s) for s in range(planned.stages)]
            tied = [TiedParameter(n, s) for n, s in zip(planned.tied, planned.tied_stages, strict=True)]
            shared = sum(p.untyped_storage().is_shared() for m in stages for p in m.parameters())
            pipe = Pipeline.from_modules(
                stages, loss_fn=lm_loss, microbatches=MICROBATCHES, policy="ready", mesh=mesh, tied=tied
            )
        else:
            pipe = Pipeline.from_plan(planned, loss_fn=lm_loss, policy="ready", mesh=mesh)
        replica = pipe.layout.replica_of(rank)
        params = list({id(p): p for m in pipe.modules.values() for p in m.parameters()}.values())
        optimizer = _optimizer(params, optimizer_name)
        states = []
        for xs, ys in _steps(replica):
            pipe.step(xs, ys)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            states.append({n: p.detach().clone() for m in pipe.modules.values() for n, p in m.named_parameters()})
        pipe.close()
        results[name] = {"shared": shared, "states": states}
    torch.save(results, Path(folder) / f"rank{rank}.pt")
    dist.destroy_process_group()


def _cases() -> tuple[list[Case], dict[str, nn.Module]]:
    models: dict[str, nn.Module] = {"gpt2": _gpt2(), "user module": UserModel()}
    cases: list[Case] = []
    for name, model in models.items():
        ids = torch.randint(0, VOCAB, (2, 9))
        kwargs = {"use_cache": False} if name == "gpt2" else None
        planned = plan(model, ids, ranks=2, microbatches=MICROBATCHES, repeats=1, kwargs=kwargs)
        cases += [(f"{name} {optimizer}", planned, optimizer, False) for optimizer in ("sgd", "adamw")]
        if name == "gpt2":
            cases.append((f"{name} modules sgd", planned, "sgd", True))
    return cases, models


@pytest.fixture(scope="module")
def spawned(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[list[dict[str, Any]], dict[str, nn.Module]]]:
    """Every case on 2 ranks and on DP 2 x PP 2, each world started once with the user's own spawn."""
    out = {}
    cases, models = _cases()  # planned once: each spawn hands the ranks copies (in shared memory)
    for world in (2, 4):
        folder = tmp_path_factory.mktemp(f"spawned{world}")
        _spawn_on_a_free_port(world, cases, folder)
        out[world] = ([torch.load(folder / f"rank{r}.pt", weights_only=True) for r in range(world)], models)
    return out


def _spawn_on_a_free_port(world: int, cases: list[Case], folder: Path, tries: int = 3) -> None:
    """The user's own spawn on a port that was free when asked for. Another test's process can take it before
    rank 0 listens (a loaded suite did: ``EADDRINUSE`` on every rank), as it can a user's on a busy machine; the
    spawn is then made again on another port, up to ``tries`` times."""
    for attempt in range(tries):
        try:
            spawn(_rank, args=(world, free_port(), cases, str(folder)), nprocs=world, join=True)  # type: ignore[no-untyped-call]
            return
        except Exception as exc:  # torch.multiprocessing's ProcessRaisedException, with the rank's traceback
            if "EADDRINUSE" not in str(exc) or attempt == tries - 1:
                raise


@pytest.mark.parametrize("world", [2, 4], ids=["2 ranks", "dp2 x pp2"])
@pytest.mark.parametrize(
    ("model", "optimizer_name", "how"),
    [
        ("gpt2", "sgd", ""),
        ("gpt2", "adamw", ""),
        ("user module", "sgd", ""),
        ("user module", "adamw", ""),
        ("gpt2", "sgd", "modules "),  # the stage modules themselves as spawn arguments
    ],
)
def test_a_users_own_spawn_trains_every_rank_on_its_own_parameters(
    spawned: dict[int, Any], world: int, model: str, optimizer_name: str, how: str
) -> None:
    results, models = spawned[world]
    name = f"{model} {how}{optimizer_name}"
    assert all(r[name]["shared"] > 0 for r in results)  # the plan arrived in shared memory, as torch spawns
    reference = copy.deepcopy(models[model])
    optimizer = _optimizer(reference.parameters(), optimizer_name)
    replicas = world // 2
    embedding = "transformer.wte.weight" if model == "gpt2" else "gpt.transformer.wte.weight"  # = the LM head
    for step in range(STEPS):
        for replica in range(replicas):  # the global batch: every replica's micro-batches
            xs, ys = _steps(replica)[step]
            for x, y in zip(xs, ys, strict=True):
                output = reference(x, use_cache=False) if model == "gpt2" else reference(x)
                torch.autograd.backward(lm_loss(_logits(output), y) / (replicas * MICROBATCHES))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        expected = dict(reference.named_parameters(remove_duplicate=False))
        first, last = results[0][name]["states"][step], results[1][name]["states"][step]
        assert torch.equal(first[embedding], last[embedding])  # the tied copies on stages 0 and 1: one tensor
        for rank, per_rank in enumerate(results):
            for parameter, value in per_rank[name]["states"][step].items():
                torch.testing.assert_close(
                    value, expected[parameter], rtol=RTOL, atol=ATOL, msg=f"rank {rank} step {step} {parameter}"
                )


_PIPED = "from hintpipe import run_ranks\ndef f(rank, world):\n    return rank\nprint(run_ranks(f, 2, device='cpu'))\n"


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_code_the_ranks_cannot_import_again_is_refused_in_one_line(how: str, tmp_path: Path) -> None:
    """A rank finds the function by importing the launcher's ``__main__`` again: code piped into ``python -``
    (before: every rank died with ``FileNotFoundError: ... '<stdin>'``, and the launcher said they exited without
    a result) or given with ``python -c`` (an ``AttributeError`` per rank) is refused before any rank starts."""
    argv = [sys.executable, "-"] if how == "stdin" else [sys.executable, "-c", _PIPED]
    done = subprocess.run(
        argv, input=_PIPED if how == "stdin" else None, capture_output=True, text=True, cwd=tmp_path, timeout=allow(120)
    )
    assert done.returncode == 1
    what = "the script <stdin>" if how == "stdin" else "code given with python -c"
    assert done.stderr.strip().splitlines()[-1] == (
        "hintpipe.runtime.errors.RankFailure: run_ranks starts processes that import the code defining f again, and "
        f"{what} is not a file they can read: save it as a file and run that (python train.py), or import the "
        "function from a module"
    )


def test_a_module_s_function_runs_from_python_c(tmp_path: Path) -> None:
    code = "import operator\nfrom hintpipe import run_ranks\nprint(run_ranks(operator.add, 2, device='cpu'))\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=allow(120)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[2, 3]"  # operator.add(rank, world) on 2 ranks
