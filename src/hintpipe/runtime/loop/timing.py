"""How long tasks took on the device.

On a CPU rank a task's compute runs in the calling thread, so the wall clock
around it is its duration. On a GPU the call returns once its kernels are
queued; the wall clock measures the launch, not the work. So a GPU rank
records a CUDA event on the compute stream before and after each task and,
at the step's end, turns the events into times on the device's own clock:
seconds from an event recorded at the loop's start. Those times replace the
host's in the step's records, so the reports and the ``ready`` plan's
measured costs read device time exactly as they read wall time on a CPU.

The dispatch itself (what is ready, what is due) stays on the host clock:
that is the clock the scoreboard decides by.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hintpipe.observe.trace import Record


class Event(Protocol):
    """What a CUDA event offers the timer (``torch.cuda.Event(enable_timing=True)``)."""

    def record(self, stream: Any = None) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...


class DeviceTimer:
    """Task start and end times from events on the device's stream.

    Args:
        new_event: makes a timing event (recorded on the current stream).
    """

    def __init__(self, new_event: Callable[[], Event]) -> None:
        self.new_event = new_event
        self._origin: Event | None = None
        self._marks: list[tuple[Event, Event]] = []

    def begin(self) -> None:
        """The loop starts: the events recorded from now on are timed from here."""
        self._origin = self.new_event()
        self._origin.record()
        self._marks = []

    def mark(self) -> Event:
        """Record an event now, on the current stream (before or after a task)."""
        event = self.new_event()
        event.record()
        return event

    def task(self, start: Event, end: Event) -> None:
        """A task ran between the events ``start`` and ``end`` (kept in the order tasks ran)."""
        self._marks.append((start, end))

    def resolve(self, records: Sequence[Record]) -> list[Record]:
        """``records`` (one per :meth:`task`, in the same order) with the device's start and end times,
        in seconds from :meth:`begin`; waits for the last task to finish on the device."""
        if len(records) != len(self._marks):
            raise ValueError(f"{len(records)} records for {len(self._marks)} timed tasks")
        if not records:
            return []
        assert self._origin is not None, "begin() was not called"
        self._marks[-1][1].synchronize()
        origin = self._origin
        return [
            (rank, task, origin.elapsed_time(start) / 1e3, origin.elapsed_time(end) / 1e3)
            for (rank, task, _, _), (start, end) in zip(records, self._marks, strict=True)
        ]
