"""How long tasks took on the device.

On a CPU rank a task's compute runs in the calling thread, so the wall clock
around it is its duration. On a GPU the call returns once its kernels are
queued; the wall clock measures the launch, not the work. So a GPU rank
records a CUDA event on the compute stream before and after each task and,
at the step's end, turns the events into times on the device's own clock:
seconds from an event recorded at the loop's start. Those times replace the
host's in the step's records, so the reports and the ``ready`` forecast's
measured costs read device time exactly as they read wall time on a CPU.

The dispatch itself (what is ready, what is due) stays on the host clock:
that is the clock the scoreboard decides by.

[Note: one clock for the ranks' timelines]
Reports put every rank's records on one clock: each rank's loop start on
the wall clock (``time.time``, the ranks' common clock) plus the records'
offsets from it. On a GPU the offsets count from the origin event, which
the device reaches when it has done the work queued before it, not when the
host recorded it; a host start with device offsets would misplace each
rank's timeline by its own lag. So the step's start is the wall-clock time
of the origin event itself: at the end, once the last task is done, one more
event is recorded and waited for (the compute stream is idle then, so it
passes at once), the wall clock is read, and the origin's time is that
reading less the device time between the two events.
"""

from __future__ import annotations

import math
import time
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
        wall: the ranks' common clock (seconds).
    """

    def __init__(self, new_event: Callable[[], Event], wall: Callable[[], float] = time.time) -> None:
        self.new_event = new_event
        self.wall = wall
        self._origin: Event | None = None
        self._marks: list[tuple[Event, Event]] = []
        #: The wall-clock time of the last resolved step's origin (see [Note: one clock for the ranks'
        #: timelines]); NaN before.
        self.started = math.nan

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
        in seconds from :meth:`begin`; waits for the last task to finish on the device, and sets
        :attr:`started` to the wall-clock time of the origin."""
        if len(records) != len(self._marks):
            raise ValueError(f"{len(records)} records for {len(self._marks)} timed tasks")
        assert self._origin is not None, "begin() was not called"
        origin = self._origin
        now = self.new_event()
        now.record()
        now.synchronize()
        self.started = self.wall() - origin.elapsed_time(now) / 1e3
        return [
            (rank, task, origin.elapsed_time(start) / 1e3, origin.elapsed_time(end) / 1e3)
            for (rank, task, _, _), (start, end) in zip(records, self._marks, strict=True)
        ]
