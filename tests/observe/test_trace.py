"""Timelines written for people (:mod:`hintpipe.observe.trace`, :mod:`hintpipe.observe.timeline`): a Perfetto
trace with one track per rank and one slice per task, and a Gantt chart of the same records."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import simulate
from hintpipe.observe.timeline import plot_timelines
from hintpipe.observe.trace import chrome_trace, write_chrome_trace
from hintpipe.schedule.task import B, F, W


def test_trace_has_one_slice_per_task_on_its_rank(tmp_path: Path) -> None:
    result = simulate("zb-h1", 3, 4)
    trace = chrome_trace(result.timeline())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == result.tasks == 36
    first = min(slices, key=lambda e: (e["ts"], e["tid"]))
    assert (first["name"], first["tid"], first["ts"], first["dur"]) == ("0F0", 0, 0.0, 1000.0)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"rank 0", "rank 1", "rank 2"}
    png = tmp_path / "t.png"
    plot_timelines([("zb-h1", result.timeline())], png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_times_are_scaled_to_microseconds_and_the_file_is_the_trace() -> None:
    records = [(1, F(0, 0), 0.5, 1.5), (1, B(0, 0), 2.0, 4.0), (0, W(1, 2), 1.0, 1.25)]
    trace = chrome_trace(records, unit_us=1e6, label="measured")
    assert trace["displayTimeUnit"] == "ms"
    meta, slices = trace["traceEvents"][:3], trace["traceEvents"][3:]
    assert [(e["name"], e.get("tid"), e["args"]["name"]) for e in meta] == [
        ("process_name", None, "measured"),
        ("thread_name", 0, "rank 0"),
        ("thread_name", 1, "rank 1"),
    ]
    assert [(e["name"], e["cat"], e["tid"], e["ts"], e["dur"], e["cname"], e["args"]) for e in slices] == [
        ("0F0", "F", 1, 500000.0, 1000000.0, "thread_state_running", {"stage": 0, "mb": 0}),
        ("0B0", "B", 1, 2000000.0, 2000000.0, "good", {"stage": 0, "mb": 0}),
        ("1W2", "W", 0, 1000000.0, 250000.0, "rail_load", {"stage": 1, "mb": 2}),
    ]


def test_the_trace_file_holds_the_trace_as_json(tmp_path: Path) -> None:
    records = [(0, F(0, 1), 0.0, 2.0)]
    write_chrome_trace(records, tmp_path / "trace.json", label="simulated")
    assert json.loads((tmp_path / "trace.json").read_text()) == chrome_trace(records, label="simulated")
