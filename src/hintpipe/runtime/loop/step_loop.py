"""One step's dispatch loop: messages in, the scoreboard's choice, compute, messages out.

The loop owns nothing but the step's state: the scoreboard decides, the
:class:`~hintpipe.runtime.loop.executor.Executor` computes and the
:class:`~hintpipe.runtime.transport.protocol.Transport` carries messages. When nothing
is ready it blocks on the transport until a message comes, the ``ready``
policy's patience runs out, or the watchdog fires.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from hintpipe.device import use_when_ready
from hintpipe.dispatch.scoreboard import Scoreboard
from hintpipe.runtime.errors import NonFiniteLoss, PeerFailure, TaskError, WatchdogTimeout
from hintpipe.runtime.loop.admission import Admission
from hintpipe.runtime.loop.asked_notices import AskedNotices
from hintpipe.runtime.loop.coordination import LOOKAHEAD, Coordination
from hintpipe.runtime.loop.executor import Executor
from hintpipe.runtime.loop.step_state import StepState
from hintpipe.runtime.loop.timing import DeviceTimer
from hintpipe.runtime.transport.protocol import Transport
from hintpipe.runtime.transport.wire import Message, MessageKind, Value, what_the_peer_said
from hintpipe.schedule import rules
from hintpipe.schedule.task import Kind, Task

if TYPE_CHECKING:
    from hintpipe.runtime.loop.hooks import StepHook


class StepLoop:
    """Runs one step of one rank to completion.

    Args:
        rank: this rank.
        board: the step's scoreboard.
        executor: runs tasks.
        transport: carries messages.
        admission: learns bytes per element from forwards (byte admission).
        timeout: seconds without progress before :class:`WatchdogTimeout`.
        stash: messages of later steps that arrived early (kept by the caller across steps).
        check_losses: called with the step's losses at the last stage and their slots, once the last is
            computed (raises on a non-finite one; see [Note: one look at the losses per step] in
            :mod:`hintpipe.runtime.loop.agreement`).
        coordination: this rank's part in its tensor-parallel group's decisions, when needed
            (see :mod:`hintpipe.runtime.loop.coordination`).
        notices: the producer notices asked for so far in the run (the ``ready`` policy's ETA rule; see [Note:
            notices asked for] in :mod:`hintpipe.runtime.transport.protocol`): a task whose consumer asked tells
            it when it starts, and this rank asks for the notices its scoreboard weighs; None: no notices.
        timer: on a GPU, times tasks with events on the device (see :mod:`hintpipe.runtime.loop.timing`);
            None: the wall clock around each task is its duration (a CPU computes in this thread).
        hooks: told when a stage finishes its gradients for the step (see :mod:`hintpipe.runtime.loop.hooks`).
    """

    def __init__(
        self,
        *,
        rank: int,
        board: Scoreboard,
        executor: Executor,
        transport: Transport,
        admission: Admission,
        timeout: float,
        stash: list[Message],
        check_losses: Callable[[Sequence[torch.Tensor], Sequence[int]], None],
        coordination: Coordination | None = None,
        notices: AskedNotices | None = None,
        timer: DeviceTimer | None = None,
        hooks: Sequence[StepHook] = (),
    ) -> None:
        self.rank = rank
        self.timer = timer
        self.board = board
        self.hint = board.hint
        #: The step's tasks by position, built once: a scoreboard keeps them as arrays, and a ``Task`` made from
        #: them per look costs the computing thread microseconds a task.
        self.tasks = list(board.tasks)
        self.executor = executor
        self.transport = transport
        self.admission = admission
        self.timeout = timeout
        self.stash = stash
        self.check_losses = check_losses
        self.coordination = coordination
        self.follower = coordination is not None and not coordination.is_leader
        self.notices = notices
        self._source: Sequence[tuple[int, Task] | None] | None = None  # the board's remote inputs, once asked
        self._t0 = 0.0  # the step's clock: perf_counter() at the loop's start
        self.hooks = hooks
        self._last_kind = rules.releaser(self.hint.split_backward)  # a stage's last gradient task per micro-batch
        self._gradients_left = {s: self.hint.microbatches for s in self.hint.placement.stages_of(rank)}
        self._announced: collections.deque[int] = collections.deque()  # a leader's decisions told ahead

    def run(self, state: StepState) -> float:
        """Run every task of the step; returns the time from the start to the last task's end.

        [Note: the runtime's own CPU time]
        Ranks that share cores (emulated ranks, 16-32 processes on a few cores) compete with each other's
        communication threads, which a cluster, where each rank has its cores, would not see; an emulated
        figure is only as good as that CPU time is small beside the work. So each step measures it: the
        process's CPU time over the loop (every thread: mailbox receivers, the sender, notices,
        coordination, heartbeats) less the computing thread's CPU time inside tasks
        (``state.measured["runtime_cpu"]``; an emulated task sleeps, so nearly all of it is the runtime's).
        With more than one intra-op thread a task's helper threads count here too: ranks run one.
        """
        board = self.board
        state.started = time.time()
        t0 = self._t0 = time.perf_counter()
        timer = self.timer
        if timer is not None:
            timer.begin()
        early, self.stash[:] = list(self.stash), []
        for msg in early:
            self._accept(msg, state)
        state.peak_bytes = self.executor.live_bytes
        last_progress = t0
        cpu0, task_cpu = time.process_time(), 0.0  # see [Note: the runtime's own CPU time]
        notices = self.notices
        while not board.done:
            while (arrived := self.transport.get(0)) is not None:
                self._accept(arrived, state)
            now = time.perf_counter()
            pos = self._follow(state) if self.follower else board.take(now - t0)
            if board.unheard:
                self._ask_for_notices(state)
            if pos >= 0 and self.coordination is not None and not self.follower:
                self._announce(pos, state)
            if pos < 0:
                if self._wait(now - t0, last_progress, state):
                    last_progress = time.perf_counter()
                continue
            if notices is not None and (out := board.remote[pos]) is not None and out[1] in notices.theirs:
                peer, consumer = out
                data = MessageKind.ACTIVATION if consumer.kind is Kind.F else MessageKind.GRADIENT
                self.transport.notify(peer, state.round, consumer.stage, consumer.mb, data)
            start, computing = time.perf_counter(), time.thread_time()
            began = timer.mark() if timer is not None else None
            self._run(pos, state)
            if timer is not None and began is not None:
                timer.task(began, timer.mark())
            end = time.perf_counter()
            task_cpu += time.thread_time() - computing
            board.finish(pos, end - t0)
            task = self.tasks[pos]
            state.records.append((self.rank, task, start - t0, end - t0))
            if task.kind is self._last_kind:
                self._gradient_done(task.stage)
            last_progress = end
        loop_time = time.perf_counter() - t0
        state.measured["runtime_cpu"] = time.process_time() - cpu0 - task_cpu
        state.measured["admitted_peak"], state.measured["admission_budget"] = board.peak, board.budget
        if timer is not None:  # the device's clock (see [Note: one clock for the ranks' timelines])
            state.records = timer.resolve(state.records)
            state.started = timer.started
            loop_time = max([0.0, *(end for *_, end in state.records)])
        state.loop_time = loop_time
        return loop_time

    def _ask_for_notices(self, state: StepState) -> None:
        """Ask the producers the scoreboard weighed unheard for notices (see [Note: notices asked for] in
        :mod:`hintpipe.runtime.transport.protocol`)."""
        board = self.board
        if self.notices is not None:
            if self._source is None:
                self._source = board.graph.source
            self.notices.ask(board.unheard, self.tasks, self._source, self.transport, state.round)
        board.unheard.clear()

    def _gradient_done(self, stage: int) -> None:
        left = self._gradients_left[stage] - 1
        self._gradients_left[stage] = left
        if left == 0:
            for hook in self.hooks:
                hook.stage_done(stage)

    def _announce(self, pos: int, state: StepState) -> None:
        """A leader tells its followers that it runs ``pos``, unless it already has, and the choices that will
        certainly follow (see [Note: decisions in batches] in :mod:`hintpipe.runtime.loop.coordination`)."""
        assert self.coordination is not None
        announced = self._announced
        fresh = []
        if announced:
            told = announced.popleft()
            if told != pos:  # the scoreboard broke [Note: decisions that nothing can change]
                raise RuntimeError(
                    f"rank {self.rank}: took task {self.board.tasks[pos]} where it had told its tensor-parallel "
                    f"followers it would run {self.board.tasks[told]} ({state.label})"
                )
        else:
            fresh.append(pos)
        ahead = self.board.certain(LOOKAHEAD)[len(announced) :]
        announced.extend(ahead)
        if fresh or ahead:
            self.coordination.announce(state.round, fresh + ahead)

    def _follow(self, state: StepState) -> int:
        """A follower runs the leader's next decision once its own inputs are here; -1 to wait."""
        if state.decisions and self.board.is_ready(state.decisions[0]):
            pos = state.decisions.popleft()
            self.board.start(pos)
            return pos
        return -1

    def _waiting_for(self, state: StepState) -> str:
        if not self.follower:
            return self.board.pending_report()
        assert self.coordination is not None
        if not state.decisions:
            return f"waits for the tensor-parallel leader's (rank {self.coordination.leader}) next decision"
        pos = state.decisions[0]
        task = self.board.tasks[pos]
        return f"waits for the input of task {task}, the leader's decision: " + ", ".join(self.board.waiting_for(pos))

    def _wait(self, now: float, last_progress: float, state: StepState) -> bool:
        """Block until a message comes (True), patience runs out, or the watchdog fires."""
        deadline = last_progress + self.timeout
        wait = deadline - time.perf_counter()
        if math.isfinite(self.board.wake_at):
            wait = min(wait, self.board.wake_at - now)
        arrived = self.transport.get(max(wait, 1e-4))
        if arrived is not None:
            self._accept(arrived, state)
            return True
        if time.perf_counter() >= deadline:
            raise WatchdogTimeout(
                f"rank {self.rank}: waited {self.timeout:g} s with nothing ready in {state.label}; "
                + self._waiting_for(state)
            )
        return False

    def _accept(self, msg: Message, state: StepState) -> None:
        if msg.kind is MessageKind.STOP:
            return
        if msg.kind is MessageKind.WANTED:  # kept for the run, whichever step asked
            if self.notices is not None:
                assert msg.of is not None
                self.notices.asked_by_peer(msg.stage, msg.of, msg.mb)
            return
        if msg.kind is MessageKind.ABORT:
            said = what_the_peer_said(msg)
            raise PeerFailure(f"rank {self.rank}: rank {msg.peer} failed in {state.label}; {said}")
        if msg.step > state.round:
            self.stash.append(msg)
            return
        if msg.kind is MessageKind.STARTED:  # a notice of a finished step is stale, not an error
            if msg.step == state.round:
                kind = Kind.F if msg.of is MessageKind.ACTIVATION else Kind.B
                self.board.producer_started(self.board.index[Task(msg.stage, kind, msg.mb)], msg.arrived - self._t0)
            return
        if msg.step < state.round:
            raise RuntimeError(f"rank {self.rank}: message of an earlier exchange ({msg.step}) in {state.label}")
        if msg.kind is MessageKind.DECISION:
            state.decisions.append(msg.mb)
            return
        task = state.receive(msg.kind, msg.stage, msg.mb, msg.tensors)
        if msg.ready is not None:
            state.arrivals[task] = msg.ready
        self.board.deliver(task)

    def _run(self, pos: int, state: StepState) -> None:
        """Compute the task at ``pos`` and pass its result on (to this rank's next stage, or a neighbour)."""
        task = self.tasks[pos]
        s, kind, mb = task
        try:
            # [Note: the compute stream waits last] A received input is ready when its bytes are on this
            # rank (see [Note: ready when the data is there] in hintpipe.runtime.transport.links), but the
            # copy or receive that put them on the device ran on another stream: the compute stream waits
            # for it here, right before the task that uses them, and not when the message is accepted,
            # where every task queued after would wait for it too.
            arrival = state.arrivals.pop(task, None)
            if arrival is not None:
                held = state.activations.get((s, mb)) if kind is Kind.F else state.gradients.get((s, mb))
                use_when_ready(held or [], arrival)
            if kind is Kind.F:
                self._forward(pos, task, state)
            elif kind is Kind.B:
                last = s == self.hint.stages - 1
                grads = self.executor.backward(s, mb, None if last else state.gradients.pop((s, mb)))
                if s > 0:
                    self._pass_on(pos, s - 1, MessageKind.GRADIENT, grads, state)
            else:
                self.executor.weight(s, mb)
        except (NonFiniteLoss, KeyboardInterrupt):
            raise
        except Exception as exc:
            raise TaskError(
                f"rank {self.rank}: task {task} (stage {s}, micro-batch {mb}) failed in {state.label}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _forward(self, pos: int, task: Task, state: StepState) -> None:
        s, _, mb = task
        before = self.executor.live_bytes
        target = state.targets[mb] if state.targets else None
        run = self.executor.evaluate if state.evaluating else self.executor.forward
        outputs, loss = run(s, mb, state.activations.pop((s, mb)), target, state.loss_scale)
        if loss is not None:
            state.losses.append(loss)
            state.loss_slots.append(mb)
            if len(state.losses) == self.hint.microbatches:
                self.check_losses(state.losses, state.loss_slots)
        state.peak_bytes = max(state.peak_bytes, self.executor.live_bytes)
        if state.elements is not None:
            self.admission.observe(s, self.executor.live_bytes - before, state.elements[mb])
        if s < self.hint.stages - 1:
            self._pass_on(pos, s + 1, MessageKind.ACTIVATION, outputs, state)

    def _pass_on(self, pos: int, stage: int, kind: MessageKind, tensors: Sequence[Value], state: StepState) -> None:
        """Hand the result of the task at ``pos`` to ``stage``: as a message where the scoreboard's routing
        table names another rank (the table the producer notices use), else in place."""
        out = self.board.remote[pos]
        if out is not None:
            peer, consumer = out
            self.transport.send(peer, kind, state.round, consumer.stage, consumer.mb, tensors)
        else:  # the scoreboard already counted the local dependency when the task finished
            state.receive(kind, stage, self.tasks[pos].mb, tensors)
