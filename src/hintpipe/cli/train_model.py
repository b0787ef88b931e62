"""The model a ``hintpipe train`` run trains, before any rank starts: what a ``--plan`` file says (its
pipeline, its model, its plan), the tokenizer a run reads its data with, and a model planned once (see
[Note: plan once] at :func:`plan_once`).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hintpipe.apps.model_config import ModelConfig, SeqLenDist
from hintpipe.apps.model_spec import DEFAULT_MODEL, MODEL_SPECS, model_kind, tokenizer_of
from hintpipe.apps.text_files import BUILT_IN_DATA, BYTES
from hintpipe.cli.model_flags import SIZES, given_sizes
from hintpipe.forming.form import Forming
from hintpipe.options import OPTIONS
from hintpipe.runtime.checkpoint.description import HF
from hintpipe.runtime.checkpoint.run_folder import PROFILES_FILE
from hintpipe.schedule.hint import Hint

if TYPE_CHECKING:  # the planner needs torch; it is imported where a model is planned
    from torch import nn

    from hintpipe.planner.capture import CapturedGraph
    from hintpipe.planner.node_profile import NodeProfile
    from hintpipe.planner.plan import Plan


#: What a plan file says: these flags default to the file's values with ``--plan``, and to the usual ones
#: without (where ``--ranks`` and ``--microbatches`` are then required). The model is the file's too.
FROM_PLAN: dict[str, Any] = {"ranks": None, "microbatches": None, "hint": "1f1b", "chunks": None}


def answered_by_plan(args: argparse.Namespace) -> dict[str, Any] | None:
    """Fill in what ``--plan`` says (refusing flags that contradict it), or the defaults without it; returns the
    plan file's contents (tensors and plain values, read safely) or None."""
    from hintpipe.planner.plan_file import read_plan_file

    path = getattr(args, "plan", None)
    if path is None:
        if getattr(args, "ranks", None) is None:
            args.ranks = torchrun_ranks(args)
        for name, default in FROM_PLAN.items():
            if getattr(args, name, None) is None:
                setattr(args, name, default)
        missing = [f"--{name}" for name in ("ranks", "microbatches") if getattr(args, name) is None]
        if missing:
            raise ValueError(f"{' and '.join(missing)} must be given (or --plan FILE, which says them)")
        return None
    if Path(path).is_dir():
        raise ValueError(
            f"--plan {path} is a folder: a plan is a file `hintpipe plan ... --save FILE` writes; to train a model "
            "folder, give it to --model"
        )
    payload = read_plan_file(path)
    try:
        return _fill_from_plan(args, path, payload)
    except (KeyError, TypeError, AttributeError) as exc:  # a file of the right format with wrong fields
        raise bad_fields(path, exc) from None


def torchrun_ranks(args: argparse.Namespace) -> int | None:
    """Under ``torchrun``, a run without ``--ranks`` or a plan: the pipeline's length is torchrun's ranks over
    ``--dp`` x ``--tp`` (``torchrun --nproc-per-node 4 -m hintpipe train ...`` is a pipeline of 4 ranks); None
    elsewhere (a spawned run says its ranks).

    Raises:
        ValueError: ``--dp`` x ``--tp`` does not divide torchrun's ranks.
    """
    if not under_torchrun():
        return None
    world = int(os.environ["WORLD_SIZE"])
    dp, tp = getattr(args, "dp", None) or 1, getattr(args, "tp", None) or 1
    if world % (dp * tp):
        raise ValueError(
            f"--ranks must be given: torchrun started {world} ranks, which --dp {dp} x --tp {tp} does not divide"
        )
    return world // (dp * tp)


def bad_fields(path: str, exc: BaseException) -> ValueError:
    what = f"no field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
    return ValueError(
        f"{path} says it is a hintpipe plan file but its fields are not a plan's ({what}); write it again with "
        "`hintpipe plan ... --save FILE`"
    )


def _fill_from_plan(args: argparse.Namespace, path: str, payload: dict[str, Any]) -> dict[str, Any]:
    data = payload["plan"]
    planned = {"ranks": data["ranks"], "microbatches": data["microbatches"], "hint": data["hint"]}
    planned |= {"chunks": data["chunks"]}
    for name, value in planned.items():
        given = getattr(args, name, None)
        if given is not None and given != value and not (name == "chunks" and value == 1):
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{path} is planned for {flag} {value}, this run asks for {flag} {given}; leave {flag} out (the plan "
                "file says it) or plan again"
            )
        setattr(args, name, value if name != "chunks" or given is not None else None)
    return payload


def plan_model(args: argparse.Namespace, path: str, payload: dict[str, Any]) -> ModelConfig:
    """The model a plan file was made for: its ModelConfig (``hintpipe plan --save``), or a Hugging Face
    description alone (``save_plan(..., model=hf_description(model))`` in Python); model flags that say
    otherwise are refused."""
    from hintpipe.apps.hf_folder import described_sizes

    said = payload["model"]
    if said.get("kind") == HF:  # a description alone (its "config" is transformers')
        model = described_sizes(said, label=str(Path(path).resolve()), seed=args.seed)
    elif "config" in said:
        model = ModelConfig(**said["config"])
    else:
        raise ValueError(
            f"{path} does not say which model it was planned for: plan it with `hintpipe plan --model ... --save`, "
            "or save it with save_plan(plan, path, model=hf_description(model))"
        )
    said_by_file = {"model": model.label, "init": model.init} | {name: getattr(model, name) for name in SIZES}
    given = {"model": args.model, "init": args.init} | given_sizes(args)
    for name, value in given.items():
        if value is None:
            continue
        same = model_kind(value) == (model.name, model.source) if name == "model" else value == said_by_file[name]
        if not same:
            flag = "--" + name.replace("_", "-")
            raise ValueError(
                f"{path} is planned for {flag} {said_by_file[name]}, this run asks for {flag} {value}; leave {flag} "
                "out (the plan file says it) or plan again"
            )
    return model


def resolve_tokenizer(args: argparse.Namespace, planned: ModelConfig | None = None) -> None:
    """``--tokenizer`` as given, else (for a corpus of files) a model folder's own tokenizer where it has one,
    else a prepared folder's own (the one its shards were made with), else bytes. ``--data`` is made its
    option's value first (one string, or a tuple of several)."""
    args.data = OPTIONS["data"].check(getattr(args, "data", None), cli=True)
    if getattr(args, "tokenizer", None) is not None:
        return
    if planned is not None:
        kind, source = planned.name, planned.source
    else:
        kind, source = model_kind(args.model or DEFAULT_MODEL)
    corpus = args.data not in BUILT_IN_DATA
    folder = tokenizer_of(source) if MODEL_SPECS[kind].own_tokenizer and source is not None and corpus else None
    if folder is None and corpus:
        folder = prepared_tokenizer(args.data)
    args.tokenizer = folder if folder is not None else BYTES


def prepared_tokenizer(data: str | tuple[str, ...]) -> str | None:
    """The tokenizer the first prepared folder among ``data``'s entries was made with (None: none is one)."""
    from hintpipe.data.manifest import is_prepared, read_manifest
    from hintpipe.data.refusal import DataRefused
    from hintpipe.data.sources import data_entries

    try:
        for entry in data_entries(data):
            if is_prepared(Path(entry.path)):
                made = read_manifest(Path(entry.path)).tokenizer
                return made.folder or BYTES
    except DataRefused:  # refused where the data are resolved, in its own words
        return None
    return None


def planned_elsewhere() -> bool:
    """Whether rank 0 of this ``torchrun`` launch measures and plans for this process (see [Note: plan
    once])."""
    return under_torchrun() and os.environ.get("RANK", "0") != "0"


def under_torchrun() -> bool:
    from hintpipe.runtime.rank_process import under_torchrun

    return under_torchrun()


def plan_once(args: argparse.Namespace, model: ModelConfig, hint: Hint, *, autocast: bool) -> Plan | None:
    """A model captured (torch.export) and cut into stages once, here, for every rank; to follow a bfloat16
    autocast where ``autocast`` (``--precision bf16``), else for float32 alone, in half the capture's time
    (see :func:`hintpipe.planner.capture.capture`).

    [Note: plan once] Spawned ranks get the launcher's plan inside their config. Under ``torchrun`` every rank
    runs this command, and plans made apart differ (they rest on measured times): only rank 0 plans, and its
    ranks receive that plan (with whatever else rank 0 measured) once the process group is up
    (:func:`hintpipe.apps.training.share_measured`). So this returns None on the other ranks.
    """
    import torch

    from hintpipe.apps.models import make_batch, whole_model
    from hintpipe.planner.fixed_shapes import FixedShapeWarning
    from hintpipe.planner.plan import plan

    if planned_elsewhere():
        return None
    torch.set_num_threads(1)
    # Under concat every micro-batch has the shape it is captured at (see [Note: dimensions the capture fixes]).
    length = model.max_seq_len - 1 if args.forming is Forming.CONCAT else min(16, model.max_seq_len - 1)
    inputs, _, _ = make_batch(model, 1, args.microbatch_size, SeqLenDist(length), 0, args.seed)
    whole, kwargs = whole_model(model)
    captured, profiles = _run_profiles(args, whole, inputs[0], kwargs, autocast)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixedShapeWarning)  # said below, in the command line's words
        planned = plan(
            whole,
            inputs[0],
            ranks=args.ranks,
            microbatches=args.microbatches,
            hint=hint,
            repeats=1,
            kwargs=kwargs or None,
            captured=captured,
            profiles=profiles,
            cache_dir=profile_cache(),
            autocast=autocast,
        )
    _check_fixed_shapes(planned.graph.fixed, model, args.forming, args.microbatch_size)
    return planned


def _check_fixed_shapes(
    fixed: tuple[tuple[str, int, int], ...], model: ModelConfig, forming: Forming, rows: int
) -> None:
    """Refuse a model whose capture fixed a size its run's micro-batches vary in (see [Note: dimensions the
    capture fixes]): under ``crop`` their lengths vary, under ``padded`` and ``packed`` their rows too; under
    ``concat`` every micro-batch is ``rows`` rows of ``max_seq_len - 1`` tokens, the shape it is captured at."""
    from hintpipe.planner.fixed_shapes import fixed_said

    varying = [
        f for f in fixed if forming is not Forming.CONCAT and not (forming is Forming.CROP and f[1:] == (0, rows))
    ]
    if varying:
        raise ValueError(
            f"--model {model.label}: torch.export fixed its {fixed_said(tuple(varying))}, so its stages run "
            f"micro-batches of one shape, and --forming {forming} makes others; --forming concat makes every "
            f"micro-batch {rows} rows of {model.max_seq_len - 1} tokens (--max-seq-len sets it), the shape it is "
            "then captured at"
        )


def profile_cache() -> Path:
    """Where ``hintpipe train`` keeps the node profiles of the models it plans: ``$HINTPIPE_CACHE/profiles``
    (else ``~/.cache/hintpipe/profiles``), per torch version.

    [Note: a planned model's runs repeat] A plan rests on measured node times, and times measured again can
    move a cut by a node: two runs of one command and seed then trained other stages (other dropout masks, see
    [Note: a task's random numbers] in :mod:`hintpipe.runtime.loop.task_seeds`). Kept by what they measured
    (the graph's code, parameter and input shapes, the device: :func:`hintpipe.planner.profile.signature`), the
    profiles make the next run of the same model on this machine plan as the first did. Delete the folder to
    measure again (a machine that was busy when they were measured).
    """
    import torch

    from hintpipe.data.cache import cache_root

    return cache_root("profiles") / f"torch-{torch.__version__}"


def _run_profiles(
    args: argparse.Namespace, whole: nn.Module, example: Any, kwargs: dict[str, Any], autocast: bool
) -> tuple[CapturedGraph | None, list[NodeProfile] | None]:
    """A resume's capture of the model and the profiles its run planned with (see [Note: a resume plans as its
    run did] in :mod:`hintpipe.apps.run_profiles`); (None, None) for a new run or a folder that keeps none, which
    capture and measure (or read the cache)."""
    from hintpipe.apps.run_profiles import recorded_profiles
    from hintpipe.planner.capture import CaptureSpec, capture

    if not (getattr(args, "resume", False) and getattr(args, "checkpoint_dir", None)):
        return None, None
    folder = Path(args.checkpoint_dir)
    recorded = recorded_profiles(folder)
    if recorded is None:
        return None, None
    captured = capture(whole, example=(example,), kwargs=kwargs or None, autocast=autocast)
    profiles = recorded.of(captured, CaptureSpec.of((example,), kwargs or None, None, autocast=autocast))
    if profiles is None:
        print(
            f"hintpipe train: {folder / PROFILES_FILE} measured another capture of the model (another micro-batch "
            "size or model): planned afresh, so the resumed run may cut the model elsewhere",
            file=sys.stderr,
        )
    return captured, profiles


def planned_model(args: argparse.Namespace, path: str, payload: dict[str, Any], model: ModelConfig) -> Plan:
    """A plan file's plan for the model it was made for, after checking it against the other options. The
    model is rebuilt from the file's description where it is a Hugging Face one (no folder or download needed:
    the file holds the weights), else from its ModelConfig.

    The plan travels to every rank inside the run's config (each rank gets its own copy), so the file is read
    once, here."""
    from hintpipe.apps.model_description import rebuild_model
    from hintpipe.apps.models import whole_model
    from hintpipe.planner.plan_file import check_plan, load_plan

    if getattr(args, "check_grads", False):
        raise ValueError("--check-grads compares with the model built from its source; it does not apply to --plan")
    said = payload["model"]
    description = said.get("description", said if said.get("kind") == HF else None)
    whole = rebuild_model(description) if description is not None and description.get("kind") == HF else None
    planned, _ = load_plan(path, whole if whole is not None else whole_model(model)[0])
    check_plan(planned, path, ranks=args.ranks, microbatches=args.microbatches)
    return planned  # its sizes and weights are the plan's
