"""One word for each concept: names retired in 0.7 appear nowhere in the code, the tests, the benchmarks or
the README, and a retired keyword still works for a release, with a ``DeprecationWarning`` naming the new
one (CHANGELOG: "Renamed")."""

from __future__ import annotations

import datetime
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import torch.distributed

from conftest import raised_here
from hintpipe.apps import training
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.train_config import TrainConfig
from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.policy import Policy
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.dispatch.variability import parse_variability
from hintpipe.forming.collate import form_batch
from hintpipe.forming.form import form_microbatches
from hintpipe.options import PipelineConfig
from hintpipe.planner.plan import Plan
from hintpipe.runtime import pipeline, rank_process
from hintpipe.runtime.launch import run_ranks
from hintpipe.runtime.loop.reports import StepReport
from hintpipe.runtime.parallel.mesh import Layout
from hintpipe.runtime.pipeline import Pipeline
from hintpipe.schedule.generators import generate_hint
from hintpipe.schedule.hint import Hint, Placement
from hintpipe.sim import predict
from hintpipe.sim.compare import run_study
from hintpipe.sim.simulate import simulate
from hintpipe.sim.simulator import Sample, SimResult, Simulator

ROOT = Path(__file__).resolve().parents[2]

#: A call's arguments, up to the keyword (one level of parentheses inside).
_ARGS = r"\((?:[^()]|\([^()]*\))*?"

#: Retired spelling -> the pattern that finds it (a call of the public API with the old keyword, an attribute).
RETIRED = {
    "run_ranks(timeout_s=...), now run_ranks(timeout=...)": re.compile(r"\brun_ranks" + _ARGS + r"\btimeout_s=", re.S),
    "init_rank(timeout_s=...), now init_rank(timeout=...)": re.compile(r"\binit_rank" + _ARGS + r"\btimeout_s=", re.S),
    "Hint.num_ranks, Placement.num_ranks, now .ranks": re.compile(r"\.num_ranks\b"),
    "Hint.num_microbatches, Hint(num_microbatches=...), now microbatches": re.compile(r"\bnum_microbatches\b"),
    "Hint.num_stages, Placement.num_stages, Plan.num_stages, CostModel.num_stages, now .stages": re.compile(
        r"\.num_stages\b"
    ),
    "Hint.ranks as the task lists, now Hint.lists": re.compile(
        r"\b\w*hint\.ranks\s*\[|\bin\s+[\w.]*hint\.ranks\b|\b(?:enumerate|len|zip)\([\w.]*hint\.ranks\b"
    ),
    "Hint(ranks=...), Hint.from_lists(ranks=...), now lists=": re.compile(
        r"\b(?:Hint|from_lists)" + _ARGS + r"\branks=", re.S
    ),
    "Layout.stages_ranks, now Layout.pp": re.compile(r"\.stages_ranks\b"),
    "Pipeline.messages, now Pipeline.carrier": re.compile(r"\b(?:pipe|pipeline)\.messages\b"),
    "Pipeline.post_office, Parts.post_office, now .carrier": re.compile(
        r"\b(?:pipe|pipeline|parts|wiring)\.post_office\b"
    ),
    "Parts.transport (the object), now Parts.carrier": re.compile(r"\bparts\.transport\b"),
    "PostOffice, LinkPostOffice, now GlooTransport, NcclTransport": re.compile(r"\b(?:Link)?PostOffice\b"),
    "Simulator.run(slack=, budgets=), now slack_microbatches=, activation_budget=": re.compile(
        r"\.run" + _ARGS + r"\b(?:slack|budgets)=", re.S
    ),
    "Simulator.budgets(slack=), size_budgets(slack=), now slack_microbatches=": re.compile(
        r"\b(?:size_)?budgets" + _ARGS + r"\bslack=", re.S
    ),
    "run_study(slack=, budgets=, order=), now slack_microbatches=, activation_budget=, microbatch_order=": re.compile(
        r"\brun_study" + _ARGS + r"\b(?:slack|budgets|order)=", re.S
    ),
    "predict_step_time(slack=), now slack_microbatches=": re.compile(
        r"\bpredict_step_time" + _ARGS + r"\bslack=", re.S
    ),
    "StepReport.step_time, now StepReport.makespan": re.compile(r"\.step_time\b"),
    "StepReport.plan_costs, predict_step_time(plan_costs=...), now forecast_costs": re.compile(
        r"\.plan_costs\b|\bplan_costs="
    ),
    "form_microbatches(order=), form_batch(order=), now microbatch_order=": re.compile(
        r"\bform_(?:microbatches|batch)" + _ARGS + r"\border=", re.S
    ),
    "RankPlan, hintpipe.dispatch.rank_plan, now RankForecast, hintpipe.dispatch.rank_forecast": re.compile(
        r"\bRankPlan\b|\brank_plan\b"
    ),
    "ReadyPlanner, .plan_for(), plans_for, hintpipe.runtime.loop.ready_plan, now ReadyForecaster, .forecast_for(), "
    "forecasts_for, ready_forecast": re.compile(r"\bReadyPlanner\b|\.plan_for\(|\bplans_for\b|\bready_plan\b"),
    "Simulator.plans(), Layout.plans(), now .forecasts()": re.compile(r"\.plans\("),
    "Scoreboard(plan=...), now Scoreboard(forecast=...)": re.compile(r"\bScoreboard" + _ARGS + r"\bplan=", re.S),
    "memory_slack, --memory-slack, now slack_microbatches, --slack-microbatches": re.compile(r"\bmemory[_-]slack\b"),
    "device_budget, --device-budget, now device_budget_fraction, --device-budget-fraction": re.compile(
        r"\bdevice[_-]budget\b(?!-fraction)"
    ),
    "import hintpipe.scoreboard, hintpipe.policy, now hintpipe.dispatch.scoreboard, .policy": re.compile(
        r"\b(?:from|import)\s+hintpipe\.(?:scoreboard|policy)\b|\bfrom\s+hintpipe\s+import\s+(?:scoreboard|policy)\b"
    ),
}

#: A line that names a retired spelling on purpose: a shim's warning or decorator, an option's name before.
_SHIM = re.compile(r"\bretired_(?:attribute|module)\(|@renamed\(|\bbefore=\"")
#: A decorator that takes retired keywords, over however many lines it is written.
_RENAMED = re.compile(r"@renamed" + _ARGS + r"\)", re.S)
#: The tests of the retired flags and config keys (they give them).
_TESTS_OF_RETIRED = ("tests/cli/test_renamed_flags.py", "tests/test_shims.py")


def _sources() -> list[Path]:
    found = [ROOT / "README.md"]
    for folder in ("src", "tests", "benchmarks", "scripts"):
        found += sorted((ROOT / folder).rglob("*.py"))
    # they take the retired keywords and attributes, and name them in their warnings and docstrings
    kept = ("runtime/launch.py", "schedule/hint.py", "renamed.py", "scoreboard.py", "policy.py")  # and the old modules
    keepers = {ROOT / "src/hintpipe" / name for name in kept} | {ROOT / name for name in _TESTS_OF_RETIRED}
    return [path for path in found if path.name != Path(__file__).name and path not in keepers]


def _text(path: Path) -> str:
    text = _RENAMED.sub("", path.read_text(encoding="utf-8"))
    return "\n".join(line for line in text.splitlines() if not _SHIM.search(line))


def test_retired_names_are_used_nowhere() -> None:
    used = [
        f"{path.relative_to(ROOT)}: {what}"
        for path in _sources()
        for what, pattern in RETIRED.items()
        if pattern.search(_text(path))
    ]
    assert used == []


def _rank(rank: int, world: int) -> int:
    return rank + world


def test_a_retired_keyword_still_works_and_says_its_new_name() -> None:
    with pytest.warns(DeprecationWarning, match=r"^run_ranks\(timeout_s=\.\.\.\) is now run_ranks\(timeout=\.\.\.\)$"):
        assert run_ranks(_rank, 1, timeout_s=60, device="cpu") == [1]


class _Waited(Exception):
    """How long the store would wait: where the test stops :func:`init_rank`, before any process group."""


class _Store:
    def __init__(self, path: str, world: int) -> None:
        pass

    def set_timeout(self, wait: datetime.timedelta) -> None:
        raise _Waited(wait)


@pytest.mark.parametrize("keyword", ["timeout_s", "timeout"])
def test_init_rank_s_retired_timeout_s_is_its_timeout(keyword: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Up to the store, with nothing of this process changed (its threads, its switch interval, its device).
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)
    monkeypatch.setattr(sys, "setswitchinterval", lambda interval: None)
    monkeypatch.setattr(rank_process, "rank_device", lambda device, rank: torch.device("cpu"))
    monkeypatch.setattr(rank_process, "FileStore", _Store)
    said = r"^init_rank\(timeout_s=\.\.\.\) is now init_rank\(timeout=\.\.\.\)$"
    with warnings.catch_warnings(record=True) as caught, pytest.raises(_Waited) as waited:
        warnings.simplefilter("always")
        _loose(rank_process.init_rank)(0, 1, device="cpu", store_file="unused", **{keyword: 45})
    assert waited.value.args == (datetime.timedelta(seconds=45),)
    matched = [re.match(said, str(w.message)) is not None for w in raised_here(caught)]
    assert matched == ([True] if keyword == "timeout_s" else [])


def _loose(fn: Any) -> Any:
    """``fn`` as mypy takes any keyword: the retired ones are not in the signatures."""
    return fn


def _hint() -> Hint:
    return generate_hint("1f1b", 2, 4)


def _simulator() -> Simulator:
    return Simulator(_hint(), CostModel.uniform(2))


def _run(**room: Any) -> tuple[float, Any]:
    result = _simulator().run(Policy.READY, **room)
    return result.makespan, result.starts


def _study(**options: Any) -> list[float]:
    mb = [parse_variability("mb:0.5")]
    study = run_study(_hint(), list(Policy), variability=mb, trials=2, admission="size", **options)
    return [study[p].makespan for p in Policy]


def _forecast_with(**costs: Any) -> float:
    hint = _hint()
    records = Simulator(hint, CostModel.uniform(2)).run(Policy.FIXED).timeline()
    return float(_loose(predict.predict_step_time)(hint, records, policy=Policy.READY, **costs))


def _predicted(module: Any, **room: Any) -> float:
    hint = _hint()
    records = Simulator(hint, CostModel.uniform(2)).run(Policy.FIXED).timeline()
    return float(module.predict_step_time(hint, records, None, Policy.READY, **room))


def _simulated_step(**room: Any) -> tuple[float, Any, Any]:
    result = _loose(simulate)("1f1b", ranks=2, microbatches=4, variability=["mb:0.5"], **room)
    return result.makespan, result.starts, result.budget


#: (the warning's exact text, the call with the retired keyword, the same with the new one).
KEYWORDS: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
    (
        "Hint(num_microbatches=...) is now Hint(microbatches=...)",
        lambda: _loose(Hint)("h", Placement.loop(2), num_microbatches=4, lists=_hint().lists),
        lambda: Hint("h", Placement.loop(2), microbatches=4, lists=_hint().lists),
    ),
    (
        "Hint(ranks=...) is now Hint(lists=...)",
        lambda: _loose(Hint)("h", Placement.loop(2), 4, ranks=_hint().lists),
        lambda: Hint("h", Placement.loop(2), 4, lists=_hint().lists),
    ),
    (
        "Hint.from_lists(num_microbatches=...) is now Hint.from_lists(microbatches=...)",
        lambda: _loose(Hint.from_lists)(
            "h", Placement.loop(2), num_microbatches=4, lists=[list(t) for t in _hint().lists]
        ),
        lambda: Hint.from_lists("h", Placement.loop(2), microbatches=4, lists=[list(t) for t in _hint().lists]),
    ),
    (
        "Hint.from_lists(ranks=...) is now Hint.from_lists(lists=...)",
        lambda: _loose(Hint.from_lists)("h", Placement.loop(2), 4, ranks=[list(t) for t in _hint().lists]),
        lambda: Hint.from_lists("h", Placement.loop(2), 4, lists=[list(t) for t in _hint().lists]),
    ),
    (
        "Simulator.run(slack=...) is now Simulator.run(slack_microbatches=...)",
        lambda: _run(slack=1),
        lambda: _run(slack_microbatches=1),
    ),
    (
        "Simulator.run(budgets=...) is now Simulator.run(activation_budget=...)",
        lambda: _run(budgets=[3.0, 3.0]),
        lambda: _run(activation_budget=[3.0, 3.0]),
    ),
    (
        "Simulator.budgets(slack=...) is now Simulator.budgets(slack_microbatches=...)",
        lambda: _loose(_simulator().budgets)(slack=2),
        lambda: _simulator().budgets(slack_microbatches=2),
    ),
    (
        "Simulator.size_budgets(slack=...) is now Simulator.size_budgets(slack_microbatches=...)",
        lambda: _loose(_simulator().size_budgets)(Sample.expected(_hint(), CostModel.uniform(2)), slack=2),
        lambda: _simulator().size_budgets(Sample.expected(_hint(), CostModel.uniform(2)), slack_microbatches=2),
    ),
    (
        "run_study(slack=...) is now run_study(slack_microbatches=...)",
        lambda: _study(slack=1),
        lambda: _study(slack_microbatches=1),
    ),
    (
        "run_study(budgets=...) is now run_study(activation_budget=...)",
        lambda: _study(budgets=[4.0, 4.0]),
        lambda: _study(activation_budget=[4.0, 4.0]),
    ),
    (
        "run_study(order=...) is now run_study(microbatch_order=...)",
        lambda: _study(order="shortest-first"),
        lambda: _study(microbatch_order="shortest-first"),
    ),
    (
        "predict_step_time(slack=...) is now predict_step_time(slack_microbatches=...)",
        lambda: _predicted(predict, slack=1),
        lambda: _predicted(predict, slack_microbatches=1),
    ),
    (
        "PipelineConfig(memory_slack=...) is now PipelineConfig(slack_microbatches=...)",
        lambda: _loose(PipelineConfig)(microbatches=4, memory_slack=2),
        lambda: PipelineConfig(microbatches=4, slack_microbatches=2),
    ),
    (
        "PipelineConfig(device_budget=...) is now PipelineConfig(device_budget_fraction=...)",
        lambda: _loose(PipelineConfig)(microbatches=4, device_budget=0.25),
        lambda: PipelineConfig(microbatches=4, device_budget_fraction=0.25),
    ),
    (
        "TrainConfig.of(memory_slack=...) is now TrainConfig.of(slack_microbatches=...)",
        lambda: _loose(TrainConfig.of)(model=ModelConfig(), ranks=2, microbatches=4, memory_slack=2),
        lambda: TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4, slack_microbatches=2),
    ),
    (
        "TrainConfig.replaced(memory_slack=...) is now TrainConfig.replaced(slack_microbatches=...)",
        lambda: _loose(TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4).replaced)(memory_slack=2),
        lambda: TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4).replaced(slack_microbatches=2),
    ),
    (
        "TrainConfig.of(device_budget=...) is now TrainConfig.of(device_budget_fraction=...)",
        lambda: _loose(TrainConfig.of)(model=ModelConfig(), ranks=2, microbatches=4, device_budget=0.25),
        lambda: TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4, device_budget_fraction=0.25),
    ),
    (
        "Simulator.run(memory_slack=...) is now Simulator.run(slack_microbatches=...)",
        lambda: _run(memory_slack=1),
        lambda: _run(slack_microbatches=1),
    ),
    (
        "Simulator.budgets(memory_slack=...) is now Simulator.budgets(slack_microbatches=...)",
        lambda: _loose(_simulator().budgets)(memory_slack=2),
        lambda: _simulator().budgets(slack_microbatches=2),
    ),
    (
        "Simulator.device_budgets(device_budget=...) is now Simulator.device_budgets(device_budget_fraction=...)",
        lambda: _loose(_simulator().device_budgets)(device_budget=0.5),
        lambda: _simulator().device_budgets(device_budget_fraction=0.5),
    ),
    (
        "Simulator.size_budgets(memory_slack=...) is now Simulator.size_budgets(slack_microbatches=...)",
        lambda: _loose(_simulator().size_budgets)(Sample.expected(_hint(), CostModel.uniform(2)), memory_slack=2),
        lambda: _simulator().size_budgets(Sample.expected(_hint(), CostModel.uniform(2)), slack_microbatches=2),
    ),
    (
        "Simulator.size_budgets(device_budget=...) is now Simulator.size_budgets(device_budget_fraction=...)",
        lambda: _loose(_simulator().size_budgets)(Sample.expected(_hint(), CostModel.uniform(2)), device_budget=0.5),
        lambda: _simulator().size_budgets(Sample.expected(_hint(), CostModel.uniform(2)), device_budget_fraction=0.5),
    ),
    (
        "run_study(memory_slack=...) is now run_study(slack_microbatches=...)",
        lambda: _study(memory_slack=1),
        lambda: _study(slack_microbatches=1),
    ),
    (
        "run_study(device_budget=...) is now run_study(device_budget_fraction=...)",
        lambda: _study(device_budget=0.5),
        lambda: _study(device_budget_fraction=0.5),
    ),
    (
        "predict_step_time(memory_slack=...) is now predict_step_time(slack_microbatches=...)",
        lambda: _predicted(predict, memory_slack=1),
        lambda: _predicted(predict, slack_microbatches=1),
    ),
    (
        "simulate(memory_slack=...) is now simulate(slack_microbatches=...)",
        lambda: _simulated_step(memory_slack=1),
        lambda: _simulated_step(slack_microbatches=1),
    ),
    (
        "simulate(device_budget=...) is now simulate(device_budget_fraction=...)",
        lambda: _simulated_step(device_budget=0.5),
        lambda: _simulated_step(device_budget_fraction=0.5),
    ),
    (
        "Scoreboard(plan=...) is now Scoreboard(forecast=...)",
        lambda: list(_loose(Scoreboard)(RankGraph(_hint(), 1), plan=_simulator().forecasts()[1], notices=True).lead),
        lambda: list(Scoreboard(RankGraph(_hint(), 1), forecast=_simulator().forecasts()[1], notices=True).lead),
    ),
    (
        "predict_step_time(plan_costs=...) is now predict_step_time(forecast_costs=...)",
        lambda: _forecast_with(plan_costs=[[1.0, 3.0, 0.0]] * 2),
        lambda: _forecast_with(forecast_costs=[[1.0, 3.0, 0.0]] * 2),
    ),
    (
        "form_microbatches(order=...) is now form_microbatches(microbatch_order=...)",
        lambda: _loose(form_microbatches)([5, 1, 3, 4, 2, 8], 3, order="given"),
        lambda: form_microbatches([5, 1, 3, 4, 2, 8], 3, microbatch_order="given"),
    ),
    (
        "form_batch(order=...) is now form_batch(microbatch_order=...)",
        lambda: _loose(form_batch)([torch.arange(n) for n in (5, 3, 2, 7)], 2, order="shortest-first").inputs,
        lambda: form_batch([torch.arange(n) for n in (5, 3, 2, 7)], 2, microbatch_order="shortest-first").inputs,
    ),
]


def _same(a: object, b: object) -> bool:
    if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
        return all(torch.equal(x, y) for x, y in zip(a, cast(list[torch.Tensor], b), strict=True))
    return a == b


@pytest.mark.parametrize(("message", "old", "new"), KEYWORDS, ids=[k[0].split(" is now")[0] for k in KEYWORDS])
def test_each_retired_keyword_still_works_and_says_its_new_name(
    message: str, old: Callable[[], object], new: Callable[[], object]
) -> None:
    with pytest.warns(DeprecationWarning, match=f"^{re.escape(message)}$") as caught:
        before = old()
    assert len(raised_here(caught)) == 1
    assert _same(before, new())


def test_the_applications_predict_step_time_takes_slack_too() -> None:
    report = cast(Any, SimpleNamespace(records=[], step=3))
    with (
        pytest.warns(
            DeprecationWarning,
            match=r"^predict_step_time\(slack=\.\.\.\) is now predict_step_time\(slack_microbatches=\.\.\.\)$",
        ),
        pytest.raises(ValueError, match="step 3's timelines were not kept"),
    ):
        _loose(training.predict_step_time)(_hint(), report, Policy.READY, slack=1)


def test_a_retired_keyword_beside_its_new_name_is_refused() -> None:
    with pytest.raises(
        TypeError, match=r"^Simulator.run\(\) takes slack_microbatches= \(before 0.7: slack=\), not both$"
    ):
        _loose(_simulator().run)(Policy.READY, slack=1, slack_microbatches=1)
    said = r"^PipelineConfig\(\) takes slack_microbatches= \(before 0.7: memory_slack=\), not both$"
    with pytest.raises(TypeError, match=said):
        _loose(PipelineConfig)(microbatches=4, memory_slack=1, slack_microbatches=1)


class _Configured(Exception):
    """The keywords a pipeline's constructor passed on: where the test stops it, before any process group."""


@pytest.mark.parametrize("constructor", ["__init__", "from_modules", "from_plan", "from_sequential"])
@pytest.mark.parametrize(
    ("old", "new"), [("memory_slack", "slack_microbatches"), ("device_budget", "device_budget_fraction")]
)
def test_each_pipeline_constructor_takes_an_option_s_name_before_as_its_name_now(
    constructor: str, old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each constructor up to the config (the one object every constructor builds first), with no process group.
    def configured(config: object, microbatches: int | None, keywords: dict[str, Any]) -> None:
        raise _Configured(keywords)

    monkeypatch.setattr(pipeline, "configured", configured)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(pipeline, "tie_to_agent", lambda: None)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    loss = torch.nn.functional.mse_loss
    first: dict[str, Callable[[dict[str, Any]], object]] = {
        "__init__": lambda room: Pipeline({0: model}, loss_fn=loss, **room),
        "from_modules": lambda room: Pipeline.from_modules(list(model), loss_fn=loss, **room),
        "from_plan": lambda room: Pipeline.from_plan(_plan(), loss_fn=loss, **room),
        "from_sequential": lambda room: Pipeline.from_sequential(model, [1], loss_fn=loss, **room),
    }
    where = "Pipeline" if constructor == "__init__" else f"Pipeline.{constructor}"
    said = f"^{re.escape(f'{where}({old}=...) is now {where}({new}=...)')}$"
    with pytest.warns(DeprecationWarning, match=said) as caught, pytest.raises(_Configured) as passed:
        first[constructor]({old: 0.5})
    assert len(raised_here(caught)) == 1
    assert passed.value.args[0] == {new: 0.5}


#: (the warning's exact text, the retired attribute read, the new one).
ATTRIBUTES: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
    ("Hint.num_microbatches is now Hint.microbatches", lambda: _hint().num_microbatches, lambda: _hint().microbatches),
    ("Hint.num_ranks is now Hint.ranks", lambda: _hint().num_ranks, lambda: _hint().ranks),
    ("Placement.num_ranks is now Placement.ranks", lambda: Placement.v_shape(3).num_ranks, lambda: 3),
    ("Hint.num_stages is now Hint.stages", lambda: _hint().num_stages, lambda: _hint().stages),
    ("Placement.num_stages is now Placement.stages", lambda: Placement.v_shape(3).num_stages, lambda: 6),
    ("CostModel.num_stages is now CostModel.stages", lambda: CostModel.uniform(3).num_stages, lambda: 3),
    ("Plan.num_stages is now Plan.stages", lambda: _plan().num_stages, lambda: 2),
    ("Layout.stages_ranks is now Layout.pp", lambda: Layout.world(4).stages_ranks, lambda: Layout.world(4).pp),
    ("StepReport.step_time is now StepReport.makespan", lambda: _report().step_time, lambda: _report().makespan),
    ("StepReport.admission_budget is now StepReport.budget", lambda: _report().admission_budget, lambda: (2.0, 1.0)),
    (
        "StepReport.plan_costs is now StepReport.forecast_costs",
        lambda: _report().plan_costs,
        lambda: ((1.0, 2.0, 0.0),),
    ),
    ("Simulator.plans() is now Simulator.forecasts()", lambda: _simulator().plans(), lambda: _simulator().forecasts()),
    (
        "PipelineConfig.memory_slack is now PipelineConfig.slack_microbatches",
        lambda: _loose(PipelineConfig(microbatches=4, slack_microbatches=2)).memory_slack,
        lambda: 2.0,
    ),
    (
        "PipelineConfig.device_budget is now PipelineConfig.device_budget_fraction",
        lambda: _loose(PipelineConfig(microbatches=4, device_budget_fraction=0.25)).device_budget,
        lambda: 0.25,
    ),
    (
        "TrainConfig.memory_slack is now TrainConfig.pipeline.slack_microbatches",
        lambda: _loose(TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=4, slack_microbatches=2)).memory_slack,
        lambda: 2.0,
    ),
    (
        "SimResult.records() is now SimResult.timeline()",
        lambda: _simulated().records(),
        lambda: _simulated().timeline(),
    ),
]


def _report() -> StepReport:
    return StepReport(
        policy=Policy.FIXED, makespan=1.5, lower_bound=1.0, busy=(1.0, 1.0), peak_live=(2.0, 1.0), budget=(2.0, 1.0),
        step=0, rank=0, records=(), peak_live_bytes=(0, 0), loss=None, forecast_costs=((1.0, 2.0, 0.0),),
    )  # fmt: skip


def _plan() -> Plan:
    # Only the cuts count here (a plan of two stages: nodes 0-2 and 3-4); making one profiles a model.
    cuts = cast(Any, SimpleNamespace(cuts=(0, 3, 5)))
    nothing = cast(Any, None)
    return Plan("1f1b", 2, 1, 4, 1, cuts, {}, (), (), graph=nothing, profiles=())


def _simulated() -> SimResult:
    return Simulator(_hint(), CostModel.uniform(_hint().stages)).run(Policy.FIXED)


@pytest.mark.parametrize(("message", "old", "new"), ATTRIBUTES, ids=[a[0].split(" is now")[0] for a in ATTRIBUTES])
def test_each_retired_attribute_still_reads_and_says_its_new_name(
    message: str, old: Callable[[], object], new: Callable[[], object]
) -> None:
    with pytest.warns(DeprecationWarning, match=f"^{re.escape(message)}$"):
        assert old() == new()


@pytest.mark.parametrize("old", ["messages", "post_office"])
def test_pipeline_s_old_names_of_its_carrier_read_it_and_are_not_written(old: str) -> None:
    # The properties' own code on a stand-in (a Pipeline needs a process group): each reads carrier; like
    # carrier itself (a pipeline's parts are fixed when it is built), neither is written.
    pipe = SimpleNamespace(carrier="the carrier")
    retired: property = Pipeline.__dict__[old]
    assert retired.fget is not None and retired.fset is None
    with pytest.warns(DeprecationWarning, match=rf"^Pipeline\.{old} is now Pipeline\.carrier$"):
        assert retired.fget(pipe) == "the carrier"
