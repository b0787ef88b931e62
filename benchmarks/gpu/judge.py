"""The GPU check's judgements: each check's rows from its measured figures, nothing measured here.

Every function below is pure: figures in, :class:`Verdict` rows out, so a test can hand one a wrong result (a
gradient dropped, one small tensor off, a skewed profile, a slow step, a memory ratio off) without a GPU and see
its row fail. A row is ``PASS`` or ``FAIL`` against the bound it states, or ``SKIP`` with the reason where it
cannot be measured here (timing bounds off CUDA: a dry run's tiny steps are the machine's load, not the device;
a memory cap off CUDA: a CPU has none). A skipped row never passes.

[Note: bounds a wrong result breaks]
Gradients: every parameter of the reference has one (a dropped or an extra gradient fails), float32 element by
element as ``torch.allclose`` (``GRAD_TOLERANCE``), bf16 tensor by tensor against that tensor's own scale
(``BF16_GRAD_REL`` x its largest expected element: a small tensor that is off fails even when the large ones
hide it in any global norm). Timing on CUDA: a hintpipe step at least ``MIN_VS_BOUND`` of the speed of both
stages' compute in one process (what ranks that time-share one GPU cannot beat: 0.8 is at most 25% over it,
looser than the project's +5% goal, which the summary still counts) and ``MIN_VS_TORCH`` of torch's
``Schedule1F1B`` on the same work; bf16 at most ``BF16_OVER_FP32`` times fp32's step on the same hint, one hint
at most ``HINT_OVER_HINT`` times another's in the same precision. Stage times: measured within
``PREDICTION_BOUND`` of predicted, the slowest within ``BALANCE_BOUND`` of the mean. Memory: what a stage held
within ``MEMORY_BOUNDS`` of the planner's bytes; under a cap, the plan's largest micro-batch at least
``MIN_CAP_RATIO`` times the compute-balanced cuts'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
#: Float32 gradients against the reference (rtol, atol): micro-batch gradients summed in another order, and on
#: CUDA (TF32 off) embedding and attention backward kernels that reduce with atomics.
GRAD_TOLERANCE = {"cpu": (1e-5, 1e-6), "cuda": (1e-4, 1e-5)}
#: bf16 gradients: each tensor's largest difference over its own largest expected element.
BF16_GRAD_REL = 2e-2
#: A pipeline's loss against the unsplit model's, relative: float32 and bf16 (the same autocast on both sides).
LOSS_REL = {"fp32": 1e-4, "bf16": 2e-2}
#: Timing bounds (CUDA): a hintpipe step's speed over its bound's and over torch's on the same work, at least.
MIN_VS_BOUND, MIN_VS_TORCH = 0.80, 0.90
#: Check 12 (CUDA): bf16's step over fp32's on one hint, and bfw's over zbv's in one precision, at most.
BF16_OVER_FP32, HINT_OVER_HINT = 1.25, 1.50
#: Check 9 (CUDA): each stage's measured time over its predicted one within this, the slowest over the mean.
PREDICTION_BOUND, BALANCE_BOUND = 0.15, 1.10
#: Check 7: what a stage's forward held over the planner's activation bytes, at least and at most.
MEMORY_BOUNDS = (0.8, 1.25)
#: Check 11: the plan's largest micro-batch under the cap over the compute-balanced cuts', at least.
MIN_CAP_RATIO = 1.0
#: Why timing rows skip off CUDA.
TIMING_OFF_CUDA = "timing is bounded on CUDA only: a CPU dry run's steps are milliseconds of the machine's load"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One row of a check: what it measured, the bound it is held to, and PASS, FAIL or SKIP (with why)."""

    row: str
    status: str
    figures: str
    bound: str
    why: str = ""

    @property
    def cell(self) -> str:
        """The verdict column: PASS, or FAIL / SKIP with the reason."""
        if self.status == PASS:
            return PASS
        shown = f"**{self.status}**" if self.status == FAIL else self.status
        return f"{shown}: {self.why}" if self.why else shown


def check(row: str, ok: bool, figures: str, bound: str, why: str = "") -> Verdict:
    """PASS if ``ok``, else FAIL with ``why`` (the figures outside the bound, by default)."""
    return Verdict(row, PASS if ok else FAIL, figures, bound, "" if ok else (why or "outside the bound"))


def skip(row: str, figures: str, bound: str, why: str) -> Verdict:
    return Verdict(row, SKIP, figures, bound, why)


def first_failing(verdicts: Sequence[Verdict]) -> Verdict | None:
    return next((v for v in verdicts if v.status == FAIL), None)


# -- gradients ----------------------------------------------------------------------------------------------


def _presence(
    row: str, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], bound: str
) -> Verdict | None:
    """A FAIL if a gradient is missing, one is there that the reference has not, or one has another shape, else
    None."""
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    shapes = [k for k in expected if k in got and got[k].shape != expected[k].shape]
    if not expected:
        return check(row, False, "no reference gradients", bound, "nothing to compare")
    if missing or extra or shapes:
        words = [f"{len(missing)} of {len(expected)} missing ({', '.join(missing[:3])})"] if missing else []
        words += [f"{len(extra)} not in the reference ({', '.join(extra[:3])})"] if extra else []
        words += [f"{len(shapes)} of another shape ({', '.join(shapes[:3])})"] if shapes else []
        return check(row, False, f"{len(got)} gradients", bound, "; ".join(words))
    return None


def judge_gradients(
    row: str, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], device: str
) -> Verdict:
    """Every parameter's gradient present and within ``GRAD_TOLERANCE`` of the reference's, element by element."""
    rtol, atol = GRAD_TOLERANCE[device]
    bound = f"every parameter's gradient, |diff| <= {atol:g} + {rtol:g} x |expected| per element"
    failed = _presence(row, got, expected, bound)
    if failed is not None:
        return failed
    worst, worst_name, outside = 0.0, "", []
    for name, want in expected.items():
        diff = (got[name].float() - want.float()).abs()
        if diff.numel() and float(diff.max()) >= worst:
            worst, worst_name = float(diff.max()), name
        if not bool((diff <= atol + rtol * want.float().abs()).all()):
            outside.append(name)
    figures = f"{len(expected)} gradients, max |diff| {worst:.2e} ({worst_name})"
    return check(row, not outside, figures, bound, f"{len(outside)} outside: {', '.join(outside[:3])}")


def judge_bf16_gradients(
    row: str, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], rel: float = BF16_GRAD_REL
) -> Verdict:
    """Every parameter's gradient present, each tensor's largest difference within ``rel`` of its own largest
    expected element (a tensor whose expected gradient is zero: within 1e-8)."""
    bound = f"every parameter's gradient, per tensor max |diff| <= {rel:g} x its max |expected|"
    failed = _presence(row, got, expected, bound)
    if failed is not None:
        return failed
    ratios = {}
    for name, want in expected.items():
        diff = _largest(got[name].float() - want.float())
        scale = _largest(want.float())
        ratios[name] = diff / scale if scale > 0 else (0.0 if diff <= 1e-8 else math.inf)
    worst = max(ratios, key=lambda k: ratios[k])
    outside = [k for k, r in ratios.items() if not r <= rel]  # NaN too
    figures = f"{len(expected)} gradients, worst tensor {worst}: max |diff| / max |expected| {ratios[worst]:.2e}"
    return check(row, not outside, figures, bound, f"{len(outside)} outside: {', '.join(outside[:3])}")


def judge_loss(row: str, loss: float, reference: float, precision: str) -> Verdict:
    rel = LOSS_REL[precision]
    ok = math.isfinite(loss) and abs(loss - reference) <= rel * abs(reference)
    return check(row, ok, f"{loss:.6f} against {reference:.6f}", f"within {rel:g} of the unsplit model's, relative")


def judge_hf_run(
    label: str,
    loss: float,
    unsplit: float,
    got: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    device: str,
) -> list[Verdict]:
    """One training run's rows: its loss and every gradient against the unsplit model's in its precision."""
    precision = label.split()[-1]
    grads = (
        judge_gradients(f"{label}: gradients", got, expected, device)
        if precision == "fp32"
        else judge_bf16_gradients(f"{label}: gradients", got, expected)
    )
    return [judge_loss(f"{label}: loss", loss, unsplit, precision), grads]


# -- checks 1 to 5: correctness ---------------------------------------------------------------------------------


def judge_offload_hooks(
    got: Mapping[str, torch.Tensor], plain: Mapping[str, torch.Tensor], moved: int, parameters_moved: int, device: str
) -> list[Verdict]:
    return [
        judge_gradients("gradients against plain autograd", got, plain, device),
        check("saved tensors moved", moved > 0, str(moved), "at least 1", "the hooks moved nothing"),
        check("parameters moved", parameters_moved == 0, str(parameters_moved), "0"),
    ]


def judge_shared_gpu(
    policy: str, ran_as: str, got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], device: str
) -> list[Verdict]:
    return [
        check(f"{policy}: ran as", ran_as == policy, ran_as, policy),
        judge_gradients(f"{policy}: gradients against the unsplit model", got, expected, device),
    ]


def judge_train_grads(returncode: int, rel: float | None, losses: Sequence[float], limit: float) -> list[Verdict]:
    ran = check("exit status", returncode == 0, str(returncode), "0")
    if returncode != 0:
        return [ran]
    shown = "none" if rel is None else f"{rel:.2e}"
    return [
        ran,
        check("largest relative gradient difference", rel is not None and rel <= limit, shown, f"<= {limit:g}"),
        check("losses finite", all(math.isfinite(v) for v in losses), str([round(v, 4) for v in losses]), "finite"),
    ]


def judge_nan_abort(returncode: int, stderr: str, words: str) -> list[Verdict]:
    heard = words in stderr
    last = " | ".join(stderr.strip().splitlines()[-2:])[:200]
    return [
        check("exit status", returncode == 1, str(returncode), "1 (the run stops)"),
        check("the neighbour says the failing rank's words", heard, "said" if heard else last, "on stderr"),
    ]


def judge_offload_training(
    offloaded: Sequence[int], got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor], device: str
) -> list[Verdict]:
    return [
        check("offloaded nodes", sum(offloaded) > 0, str(list(offloaded)), "at least 1", "the plan offloads nothing"),
        judge_gradients("gradients against the unsplit model", got, expected, device),
    ]


# -- timing ---------------------------------------------------------------------------------------------------


def judge_speed(row: str, step_s: float, reference_s: float, minimum: float, reference: str, device: str) -> Verdict:
    """A step's speed over a reference's on the same work (``reference_s / step_s``), at least ``minimum``."""
    ratio = reference_s / step_s if step_s > 0 else math.inf
    figures = f"{step_s * 1e3:.1f} ms against {reference_s * 1e3:.1f} ms: {ratio:.3f}x"
    bound = f"speed >= {minimum:g}x that of {reference}"
    if device != "cuda":
        return skip(row, figures, bound, TIMING_OFF_CUDA)
    return check(row, ratio >= minimum, figures, bound)


def judge_throughput(
    steps: Mapping[str, float | str],
    bounds: Mapping[str, float],
    torch_step: float | str,
    torch_work: Sequence[str],
    device: str,
    bound_words: str = "the unsplit model in one process",
) -> list[Verdict]:
    """Per hintpipe run (its label, its median step or why it did not run): its speed over its bound's (the
    bound of its precision and lengths, ``bounds[label]``), and for the runs whose work torch's
    ``Schedule1F1B`` ran too (``torch_work``), over torch's."""
    out = []
    for label, step in steps.items():
        if isinstance(step, str):
            out.append(check(f"{label}: ran", False, "-", "runs", step))
            continue
        out.append(judge_speed(f"{label}: against the bound", step, bounds[label], MIN_VS_BOUND, bound_words, device))
        if label not in torch_work:
            continue
        row, bound = f"{label}: against torch Schedule1F1B", f"speed >= {MIN_VS_TORCH:g}x that of torch Schedule1F1B"
        if isinstance(torch_step, str):
            out.append(skip(row, "-", bound, f"torch's run did not run: {torch_step}"))
        else:
            out.append(judge_speed(row, step, torch_step, MIN_VS_TORCH, "torch Schedule1F1B", device))
    return out


def judge_slow_bf16(steps: Mapping[tuple[str, str], float | str], device: str) -> list[Verdict]:
    """Check 12: each (hint, precision) run ran; bf16's step over fp32's per hint at most ``BF16_OVER_FP32``,
    bfw's over zbv's per precision at most ``HINT_OVER_HINT``."""
    out = [check(f"{h} {p}: ran", False, "-", "runs", s) for (h, p), s in steps.items() if isinstance(s, str)]
    pairs = [(f"{h}: bf16 over fp32", (h, "bf16"), (h, "fp32"), BF16_OVER_FP32) for h in ("bfw", "zbv")]
    pairs += [(f"{p}: bfw over zbv", ("bfw", p), ("zbv", p), HINT_OVER_HINT) for p in ("fp32", "bf16")]
    for row, a, b, most in pairs:
        x, y = steps.get(a), steps.get(b)
        bound = f"step ratio <= {most:g}"
        if not isinstance(x, float) or not isinstance(y, float):
            out.append(skip(row, "-", bound, "a run it compares did not run"))
            continue
        figures = f"{x * 1e3:.1f} ms / {y * 1e3:.1f} ms = {x / y:.2f}x"
        out.append(
            skip(row, figures, bound, TIMING_OFF_CUDA)
            if device != "cuda"
            else check(row, x / y <= most, figures, bound)
        )
    return out


def judge_stage_times(label: str, predicted: Sequence[float], measured: Sequence[float], device: str) -> list[Verdict]:
    """Check 9: each stage's measured time within ``PREDICTION_BOUND`` of its prediction, the slowest measured
    stage within ``BALANCE_BOUND`` of the mean."""
    out = []
    low, high = 1 - PREDICTION_BOUND, 1 + PREDICTION_BOUND
    for stage, (p, m) in enumerate(zip(predicted, measured, strict=True)):
        ratio = m / p if p > 0 else math.inf
        row, figures = f"{label}, stage {stage}: measured / predicted", f"{m:.3f} / {p:.3f} ms = {ratio:.3f}"
        bound = f"{low:g}-{high:g}"
        out.append(
            skip(row, figures, bound, TIMING_OFF_CUDA)
            if device != "cuda"
            else check(row, low <= ratio <= high, figures, bound)
        )
    balance = max(measured) / (sum(measured) / len(measured))
    row, figures, bound = f"{label}: slowest measured / mean", f"{balance:.3f}", f"<= {BALANCE_BOUND:g}"
    out.append(
        skip(row, figures, bound, TIMING_OFF_CUDA)
        if device != "cuda"
        else check(row, balance <= BALANCE_BOUND, figures, bound)
    )
    return out


# -- memory -----------------------------------------------------------------------------------------------------


def judge_memory(stages: Sequence[tuple[str, float, float, str]]) -> list[Verdict]:
    """Check 7: per ``(row, predicted bytes, held bytes, why not measured)``, held over predicted within
    ``MEMORY_BOUNDS``; a row with a reason it could not be measured skips with it."""
    low, high = MEMORY_BOUNDS
    out = []
    for row, predicted, held, why_not in stages:
        ratio = held / predicted if predicted > 0 else math.inf
        figures = f"held {held / 2**20:.3f} MiB / predicted {predicted / 2**20:.3f} MiB = {ratio:.3f}"
        bound = f"{low:g}-{high:g}"
        out.append(skip(row, figures, bound, why_not) if why_not else check(row, low <= ratio <= high, figures, bound))
    return out


#: Why an offloading stage's memory row skips off CUDA.
OFFLOAD_OFF_CUDA = (
    "on a CPU the offload hooks keep the node's saved tensors out of the count; the allocator's figure is CUDA's"
)


def judge_memory_cap(planned: tuple[int, int], measured: tuple[int, int] | None, device: str) -> list[Verdict]:
    """Check 11: the plan's largest micro-batch over the compute-balanced cuts', as the planner predicts it and
    as measured under the cap (CUDA), at least ``MIN_CAP_RATIO`` (and the plan's at least 1 row)."""
    bound = f"plan >= {MIN_CAP_RATIO:g}x the compute-balanced cuts', and >= 1 row"
    out = []
    for row, pair in (("planner's largest micro-batch", planned), ("largest micro-batch under the cap", measured)):
        if pair is None:
            out.append(skip(row, "-", bound, "a CPU has no per-process memory cap (CUDA only)"))
            continue
        ours, theirs = pair
        ok = ours >= 1 and ours >= MIN_CAP_RATIO * theirs
        out.append(check(row, ok, f"plan {ours} rows, compute-balanced cuts {theirs}", bound))
    return out


def _largest(t: torch.Tensor) -> float:
    """The largest absolute element (0 for an empty tensor)."""
    return float(t.abs().max()) if t.numel() else 0.0


def max_abs_diff(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> float:
    """The largest absolute difference over the gradients both have (for the figures; the rows judge)."""
    common = [k for k in expected if k in got]
    return max((_largest(got[k].float() - expected[k].float()) for k in common), default=0.0)
