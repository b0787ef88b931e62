"""The GPU check's results: one :class:`Result` per check, its rows' verdicts (:mod:`judge`), written as each
check ends (``NN-name.md`` and ``.json``, and ``results.md`` / ``results.json`` with every check so far), and the
one final line that names the first failing row."""

from __future__ import annotations

import dataclasses
import json
import re
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from judge import FAIL, PASS, SKIP, Verdict, check, first_failing, skip
from tables import Table

#: What the whole check may take on one GPU (two ranks sharing it).
BUDGET_S = 300.0


@dataclasses.dataclass
class Result:
    """One check: its rows' verdicts, a line that sums them up, a table of its figures with notes, and its
    figures for the JSON file. It passed when no row failed."""

    number: int
    title: str
    passed: bool = False
    summary: str = ""
    verdicts: list[Verdict] = dataclasses.field(default_factory=list)
    headers: list[str] = dataclasses.field(default_factory=list)
    rows: list[list[str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    left: int = 1  # leading text columns (aligned left)

    def table(self, table: Table) -> None:
        self.headers, self.rows, self.notes, self.data = table.headers, table.rows, table.notes, table.data
        self.left = table.left

    def judge(self, verdicts: Sequence[Verdict]) -> None:
        """Add rows' verdicts; the check passes while none failed."""
        self.verdicts += verdicts
        self.passed = bool(self.verdicts) and first_failing(self.verdicts) is None

    @property
    def status(self) -> str:
        """FAIL if a row failed, SKIP if every row skipped, else PASS."""
        if not self.passed:
            return FAIL
        return SKIP if all(v.status == SKIP for v in self.verdicts) else PASS

    def markdown(self) -> str:
        verdict = {PASS: "passed", SKIP: "skipped", FAIL: "**FAILED**"}[self.status]
        lines = [f"## {self.number}. {self.title}: {verdict}", "", self.summary, ""]
        lines += _table(
            ["row", "figures", "bound", "verdict"], [[v.row, v.figures, v.bound, v.cell] for v in self.verdicts], 4
        )
        if self.rows:
            lines += _table(self.headers, self.rows, self.left)
        lines += [f"- {note}" for note in self.notes]
        lines.append(f"- ({self.seconds:.0f} s)")
        return "\n".join(lines) + "\n"

    @property
    def slug(self) -> str:
        return f"{self.number:02d}-" + re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")[:40]


def _table(headers: list[str], rows: list[list[str]], left: int) -> list[str]:
    align = ["---" if i < left else "---:" for i in range(len(headers))]
    return ["| " + " | ".join(cells) + " |" for cells in [headers, align, *rows]] + [""]


def run_check(number: int, title: str, run: Callable[[Any, Result], None], setup: Any, out: Path) -> Result:
    """Run one check (whatever it raises fails it, and the next one still runs) and write its result now."""
    print(f"[{time.strftime('%H:%M:%S')}] {number}. {title} ...", flush=True)
    result = Result(number, title)
    start = time.perf_counter()
    try:
        run(setup, result)
    except Exception as exc:  # any failure of one check: report it, go on with the next
        result.summary = f"Could not run: {type(exc).__name__}: {exc}".splitlines()[0][:500]
        result.judge([check("the check ran", False, "-", "runs to its end", result.summary)])
        result.data["traceback"] = traceback.format_exc()
    result.seconds = time.perf_counter() - start
    (out / f"{result.slug}.md").write_text(result.markdown())
    (out / f"{result.slug}.json").write_text(json.dumps(dataclasses.asdict(result), indent=2, default=str) + "\n")
    counts = {s: sum(v.status == s for v in result.verdicts) for s in (PASS, FAIL, SKIP)}
    words = f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped"
    print(f"    {result.status} ({result.seconds:.0f} s; rows {words}): {result.summary}", flush=True)
    return result


def total_time(seconds: float, device: str) -> Verdict:
    """The whole check within :data:`BUDGET_S` on a GPU."""
    row, figures, bound = "the whole check's time", f"{seconds:.0f} s", f"<= {BUDGET_S:g} s on one GPU"
    if device != "cuda":
        return skip(row, figures, bound, "the budget is the GPU run's; a CPU dry run runs smaller models")
    return check(row, seconds <= BUDGET_S, figures, bound)


def final_line(results: Sequence[Result], whole: Verdict) -> str:
    """One line: the first failing row (check number, title, row, why), or that every row passed."""
    for result in results:
        failing = first_failing(result.verdicts)
        if failing is not None:
            return f"first failing row: {result.number}. {result.title}: {failing.row}: {failing.why}"
    if whole.status == FAIL:
        return f"first failing row: {whole.row}: {whole.figures}, over {whole.bound}"
    rows = [v for r in results for v in r.verdicts]
    skipped = sum(v.status == SKIP for v in rows)
    return f"all passed: {len(results)} checks, {len(rows) - skipped} rows passed, {skipped} skipped"


def write_summary(
    out: Path, env: dict[str, Any], argv: Sequence[str], results: list[Result], whole: Verdict | None = None
) -> None:
    """``results.md`` and ``results.json``: every check so far; at the end, the whole check's time and the
    final line."""
    head = [
        "# hintpipe GPU check",
        "",
        f"- device: **{env['device']}**" + (f" (CUDA {env['cuda']})" if env["cuda"] else ""),
        f"- torch {env['torch']}, Python {env['python']}, {env['cpus']} CPUs ({env['host']})",
        f"- hintpipe {env['hintpipe']}; {env['date']}; `{' '.join(['gpu_check.py', *argv])}`",
        "",
        "| check | result | rows passed / failed / skipped | seconds |",
        "|---|---|---:|---:|",
    ]
    for r in results:
        counts = " / ".join(str(sum(v.status == s for v in r.verdicts)) for s in (PASS, FAIL, SKIP))
        head.append(f"| {r.number}. {r.title} | {r.status} | {counts} | {r.seconds:.0f} |")
    end = [] if whole is None else ["", f"- {whole.row}: {whole.figures} ({whole.bound}): {whole.cell}"]
    end += [] if whole is None else [f"- {final_line(results, whole)}"]
    (out / "results.md").write_text("\n".join([*head, *end, ""]) + "\n" + "\n".join(r.markdown() for r in results))
    payload: dict[str, Any] = {"environment": env, "checks": [dataclasses.asdict(r) for r in results]}
    if whole is not None:
        payload |= {"whole": dataclasses.asdict(whole), "final": final_line(results, whole)}
    (out / "results.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
