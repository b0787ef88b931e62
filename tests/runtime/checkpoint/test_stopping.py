"""A run stopped from outside: signals to the launcher and its ranks, killed launchers, a stop file, elastic
restarts under torchrun.

Each test stops a real run and asserts what it leaves: the step it saved, its message and exit status, the
time from the stop to the end of every process, that no process or temporary folder is left behind, and a
resume that ends bitwise equal.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import SMALL_CLI, SMALL_GPT, allow, hang_bound, same_tensors
from hintpipe.apps.models import SeqLenDist
from hintpipe.options import PipelineConfig
from hintpipe.runtime import liveness
from hintpipe.runtime.checkpoint import stopping
from hintpipe.runtime.checkpoint.manifest import Manifest
from hintpipe.runtime.checkpoint.merged import load_merged
from hintpipe.runtime.checkpoint.saving import (
    CheckpointError,
    find_checkpoint,
)
from hintpipe.runtime.errors import PeerFailure, RankFailure
from hintpipe.runtime.launch import FOLDER_PREFIX, LAUNCHER_FILE, remove_stale_folders, run_ranks
from processes import children, descendants

MODEL = SMALL_GPT
TIMEOUT = 20.0


# -- signals -------------------------------------------------------------------------------------------------


def _launch(folder: Path, steps: int = 100000, every: int = 2, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "hintpipe", "train", *SMALL_CLI, "--steps", str(steps), "--json"]
    argv += ["--checkpoint-dir", str(folder), "--checkpoint-every", str(every), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def _all_gone(pids: list[int], within: float = 10.0) -> bool:
    """Every process ended (the resource tracker leaves a moment after the launcher)."""
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _wait_training(process: subprocess.Popen[str], folder: Path) -> list[int]:
    """The launcher's processes (its children and theirs), once the first checkpoint is written (the ranks are
    mid-run)."""
    deadline = time.monotonic() + hang_bound(TIMEOUT)
    while not (folder / "latest").exists():
        assert process.poll() is None, process.communicate(timeout=allow(30))[1]
        assert time.monotonic() < deadline, "no checkpoint was ever written"
        time.sleep(0.1)
    return descendants(process.pid)


def _signalled(folder: Path, signum: int, to_group: bool) -> tuple[subprocess.Popen[str], str, list[int], float]:
    process = _launch(folder)
    ranks = _wait_training(process, folder)
    sent = time.monotonic()
    if to_group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, err = process.communicate(timeout=hang_bound(TIMEOUT))
    return process, err, ranks, time.monotonic() - sent


def _folders_of(launcher: int) -> list[Path]:
    """The temporary folders the launcher ``launcher`` made that still exist (other runs' come and go)."""
    found = []
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        try:
            if (folder / LAUNCHER_FILE).read_text().strip() == str(launcher):
                found.append(folder)
        except OSError:
            continue
    return found


def _check_stopped(process: subprocess.Popen[str], err: str, signum: int, folder: Path) -> int:
    """The run said, in its last line, which checkpoint it saved after which step; returns that step."""
    assert process.returncode == 128 + signum, err
    saved = max(p for p in folder.iterdir() if p.name.startswith("step-"))
    step = int(saved.name.removeprefix("step-"))
    assert err.strip().splitlines()[-1] == (
        f"hintpipe train: stopped by {signal.Signals(signum).name} after step {step} of 100000: checkpoint {saved} "
        f"saved; --resume continues from step {step}"
    ), err
    Manifest.read(saved).verify(saved)
    return step


@pytest.mark.parametrize(("signum", "to_group"), [(signal.SIGINT, False), (signal.SIGHUP, True)])
def test_a_signal_finishes_the_step_saves_and_leaves_nothing_behind(
    signum: int, to_group: bool, tmp_path: Path
) -> None:
    # SIGTERM to the launcher alone: test_a_run_stopped_by_a_signal_resumes_bitwise. SIGHUP to the launcher and
    # its ranks, as a dropped SSH session sends it to the session's process group, stops the run as SIGTERM does.
    folder = tmp_path / "ck"
    process, err, ranks, elapsed = _signalled(folder, signum, to_group)
    assert elapsed < 30
    _check_stopped(process, err, signum, folder)
    assert len(ranks) >= 2 and _all_gone(ranks)  # the ranks (and multiprocessing's resource tracker)
    assert _folders_of(process.pid) == []  # this run left no temporary folder behind


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    # Messages 300 ms late: a step takes seconds, so the second signal comes while the ranks finish theirs.
    process = _launch(folder, 100000, 1, "--variability", "comm:300ms")
    ranks = _wait_training(process, folder)
    process.send_signal(signal.SIGINT)
    # Two signals pending at once are one (POSIX does not queue them): the second goes only once the launcher
    # has handled the first, which it says on stderr.
    assert process.stderr is not None
    said: list[str] = []
    deadline = time.monotonic() + hang_bound(TIMEOUT)
    while not any("again stops at once" in line for line in said):
        readable, _, _ = select.select([process.stderr], [], [], max(0.0, deadline - time.monotonic()))
        assert readable, "the launcher never said it handled the first signal: " + "".join(said)
        line = process.stderr.readline()
        assert line, "".join(said)
        said.append(line)
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=hang_bound(TIMEOUT))
    err = "".join(said) + rest
    assert process.returncode == 128 + signal.SIGINT, err
    assert err.strip().splitlines()[-1] == "hintpipe train: ranks killed after a second SIGINT; nothing more was saved"
    assert len(ranks) >= 2 and _all_gone(ranks)  # the ranks (and multiprocessing's resource tracker)
    assert _folders_of(process.pid) == []  # this run left no temporary folder behind


def _ranks_of(launcher: int) -> list[int]:
    """The launcher's rank processes: its children but multiprocessing's resource tracker and fork server, and
    the fork server's children (on Linux the ranks are forked from it)."""
    ranks = []
    for child in children(launcher):
        command = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"forkserver" in command:
            ranks += children(child)
        elif b"resource_tracker" not in command:
            ranks.append(child)
    return ranks


def test_a_rank_killed_mid_run_is_named_by_every_rank(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    process = _launch(folder, 100000, 1)
    _wait_training(process, folder)
    victim = _ranks_of(process.pid)[-1]
    os.kill(victim, signal.SIGKILL)  # as the out-of-memory killer does
    _, err = process.communicate(timeout=hang_bound(TIMEOUT))
    assert process.returncode == 1, err
    lines = err.strip().splitlines()
    killed = [line for line in lines if line.endswith(": exited without a result (killed by SIGKILL)")]
    assert len(killed) == 1, err
    dead = int(killed[0].split(":")[0].removeprefix("rank "))
    (other,) = [line for line in lines if line.startswith(f"rank {1 - dead}: ")]
    # Mid-step its peer's mailbox (or the step's loss broadcast, or the stop check after it) sees the
    # connection drop; during a save, the phase sees its heartbeat stop.
    mid_step = f"rank {1 - dead}: PeerFailure: rank {1 - dead}: rank {dead} failed in "
    saving = rf"rank {1 - dead}: CheckpointError: saving checkpoint step (\d+) in {re.escape(str(folder))} failed "
    saving += rf"\(rank {dead} stopped answering \(no sign of life for \d s\)\)"
    saving += rf"(; {re.escape(str(folder))}/step-\d+ was whole and published before that: --resume continues from it)?"
    assert _folders_of(process.pid) == []
    latest = (folder / "latest").read_text()
    Manifest.read(folder / latest).verify(folder / latest)
    # Which of the two it said is where the kill landed, and the folder says where that was (a checkpoint after
    # every step): in the save of the step after the newest checkpoint (or in that save's last phase, after rank 0
    # published it), or in the step that checkpoint began.
    newest = int(latest.removeprefix("step-"))
    in_save = re.fullmatch(saving, other)
    if in_save is not None and in_save.group(2):  # lost after rank 0 published the step it was saving
        assert int(in_save.group(1)) == newest, err
        assert in_save.group(2).startswith(f"; {folder / latest} was whole"), err
    elif in_save is not None:
        assert int(in_save.group(1)) == newest + 1, err
    else:
        assert other.startswith(mid_step), err
        named = re.search(r"step (-?\d+)", other.removeprefix(mid_step))
        assert named is not None and int(named.group(1)) == newest, err


@pytest.mark.parametrize("step", [None, 7])
def test_a_peer_lost_in_the_stop_check_names_the_step(monkeypatch: pytest.MonkeyPatch, step: int | None) -> None:
    def reset(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[../pair.cc:553] Connection closed by peer [127.0.0.1]:5506")

    monkeypatch.setattr(torch.distributed, "all_reduce", reset)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(liveness, "wait_for_silence", lambda: {1: 21.0})
    after = "a step" if step is None else "step 7"
    with pytest.raises(PeerFailure) as raised:
        stopping.StopRequest().agreed(step=step)
    said = f"rank 0: rank 1 failed in the check for a stop request after {after} "
    assert str(raised.value) == said + "(rank 1 stopped answering (no sign of life for 21 s))"
    monkeypatch.setattr(liveness, "wait_for_silence", lambda: {})
    with pytest.raises(PeerFailure) as raised:
        stopping.StopRequest().agreed(step=step)
    said = f"rank 0: the check for a stop request after {after} failed: "
    assert str(raised.value) == said + "RuntimeError: Connection closed by peer [127.0.0.1]:5506"


def test_sigquit_stops_at_once_and_leaves_nothing_behind(tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    process = _launch(folder, 100000, 1)
    ranks = _wait_training(process, folder)
    process.send_signal(signal.SIGQUIT)
    _, err = process.communicate(timeout=hang_bound(TIMEOUT))
    assert process.returncode == 128 + signal.SIGQUIT, err
    assert err.strip().splitlines()[-1] == "hintpipe train: ranks killed after SIGQUIT; nothing more was saved"
    assert len(ranks) >= 2 and _all_gone(ranks)
    assert _folders_of(process.pid) == []
    Manifest.read(folder / (folder / "latest").read_text()).verify(folder / (folder / "latest").read_text())


def test_a_run_stopped_by_a_signal_resumes_bitwise(tmp_path: Path) -> None:
    stopped, reference = tmp_path / "stopped", tmp_path / "reference"
    process, err, ranks, elapsed = _signalled(stopped, signal.SIGTERM, to_group=False)
    assert elapsed < 30
    step = _check_stopped(process, err, signal.SIGTERM, stopped)
    assert len(ranks) >= 2 and _all_gone(ranks)  # the ranks (and multiprocessing's resource tracker)
    assert _folders_of(process.pid) == []  # this run left no temporary folder behind
    end = str(step + 2)
    for folder, more in ((stopped, ["--resume"]), (reference, [])):
        argv = [sys.executable, "-m", "hintpipe", "train", *SMALL_CLI, "--steps", end, "--json"]
        argv += ["--checkpoint-dir", str(folder), "--checkpoint-every", "1", *more]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=hang_bound(TIMEOUT))
        assert done.returncode == 0, done.stderr[-3000:]
    final = f"step-{step + 2:08d}"
    assert same_tensors(load_merged(stopped / final), load_merged(reference / final))


@pytest.mark.parametrize("frozen", [0, 1])
def test_a_rank_stopped_while_it_saves_is_named_and_every_rank_ends(tmp_path: Path, frozen: int) -> None:
    # A rank stops itself (SIGSTOP) inside its save of step 2, as a rank does on a frozen disk or a debugger
    # attaching: the other names it once its heartbeat has been silent for --timeout, and the launcher kills it.
    # Rank 0 too: the rendezvous store lives in the launcher, not in rank 0, so it does not stop with it.
    folder, other = tmp_path / "ck", 1 - frozen
    began = time.monotonic()
    process = _launch(folder, 4, 1, "--faults", f"savestop:{frozen}:1", "--timeout", "5")
    _, err = process.communicate(timeout=hang_bound(5.0))
    elapsed = time.monotonic() - began
    assert process.returncode == 1, err
    said = err.strip().splitlines()[-3:]
    assert said[0] == "hintpipe train: failed:", err
    assert said[1 + frozen] == f"rank {frozen}: exited without a result (stopped by the launcher)", err
    # The cause, asserted: the frozen rank is named, and the silence it reports is at least what makes a rank
    # count as stopped (liveness.SILENT_AFTER) and at most the run's whole time (not a figure of the clock).
    saving = rf"rank {other}: CheckpointError: saving checkpoint step 2 in {re.escape(str(folder))} failed "
    found = re.fullmatch(
        saving + rf"\(rank {frozen} stopped answering \(no sign of life for (\d+) s\)\)", said[1 + other]
    )
    assert found is not None, said[1 + other]
    assert liveness.SILENT_AFTER <= int(found.group(1)) <= elapsed
    # Ended by the 5 s of silence, not by the default timeout: a bound on what ended it, not on how fast a loaded
    # machine starts ranks (it was 60 s, and a run beside five other test files took 64).
    assert elapsed < PipelineConfig(microbatches=1).timeout, elapsed
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "run.json", "run.lock", "step-00000001"]
    Manifest.read(folder / "step-00000001").verify(folder / "step-00000001")
    assert _all_gone(_group(process.pid))  # the ranks (and multiprocessing's resource tracker, a moment later)


def _read_a_fifo(rank: int, world: int, fifo: str) -> int:
    from hintpipe.runtime.checkpoint.collective import together

    return together(lambda: len(Path(fifo).read_bytes()), f"reading {fifo}", error=CheckpointError)[rank]


def test_ranks_blocked_in_file_io_end_naming_what_they_awaited(tmp_path: Path) -> None:
    # Every rank opens a FIFO no one writes (a forged checkpoint's "file"): before, each blocked in open() while
    # its heartbeat went on, and nothing ended. A writer comes after 60 s, so that a runtime without the
    # watchdog ends too (and fails the test) rather than hang it.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    done = threading.Event()

    def writer_at_last() -> None:
        if done.wait(60):
            return
        while not done.is_set():
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader yet
                time.sleep(0.1)

    valve = threading.Thread(target=writer_at_last, daemon=True)
    valve.start()
    try:
        with pytest.raises(RankFailure) as failed:
            run_ranks(_read_a_fifo, 2, str(fifo), timeout=2.0)
    finally:
        done.set()
        valve.join(timeout=allow(10))
    assert str(failed.value).splitlines() == [
        f"rank {rank}: CheckpointError: reading {fifo} failed (rank {rank}: its own part of reading {fifo} made no "
        "progress in 7 s (blocked in file I/O: a FIFO, a hung file system?))"
        for rank in (0, 1)
    ]


def _group(pid: int) -> list[int]:
    """The processes of the session ``pid`` leads (a launcher started in a session of its own, and its ranks)."""
    found = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True, text=True, timeout=allow(30)).stdout.split()
    return [int(p) for p in found if _alive(int(p))]


def _published(folder: Path) -> set[int]:
    """The steps of the checkpoints published in ``folder`` (renamed into place; a ``.tmp`` one is not)."""
    return {int(p.name.removeprefix("step-")) for p in folder.glob("step-*") if p.name[5:].isdigit()}


def _nothing_published_after(at_kill: set[int], now: set[int]) -> bool:
    """Whether ``now`` holds no checkpoint published after the kill that ``at_kill`` was listed at: at most the
    one step after the newest then, a save that had passed its last check (see [Note: nothing published after
    the launcher died]) and was renaming its folder when the process it checks died."""
    return now - at_kill <= {max(at_kill, default=0) + 1}


def test_ranks_never_outlive_a_killed_launcher(tmp_path: Path) -> None:
    # SIGKILL to the launcher while its ranks start (0.3 s and 1.5 s in: before and while they import torch) and
    # once they train (its first checkpoint written): every rank ends, and no checkpoint is published after the
    # kill (the folder listed at the kill, and again once every process is gone). Three runs at once, each
    # saving every step.
    runs = {name: _launch(tmp_path / name, 100000, 1) for name in ("0.3 s", "1.5 s", "training")}
    try:
        began = time.monotonic()
        at_kill: dict[str, set[int]] = {}
        for name, process in runs.items():
            if name == "training":
                _wait_training(process, tmp_path / name)
            else:
                time.sleep(max(0.0, began + float(name.split()[0]) - time.monotonic()))
            process.kill()
            at_kill[name] = _published(tmp_path / name)
            process.wait(timeout=allow(15))  # not communicate(): a rank left alive holds the pipes open
        assert at_kill["training"], "the training run was killed before its first checkpoint"
        for name, process in runs.items():
            deadline = time.monotonic() + allow(15)
            while _group(process.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _group(process.pid) == [], f"killed at {name}: ranks left"
            process.communicate(timeout=allow(15))
        for name in runs:
            assert _nothing_published_after(at_kill[name], _published(tmp_path / name)), (name, at_kill[name])
    finally:  # a rank left alive by a failed check: its session, killed (the launcher led it)
        for process in runs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def test_a_dead_launchers_temporary_folder_is_removed_by_the_next() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=allow(30))  # its pid is no one's now
    stale = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    (stale / LAUNCHER_FILE).write_text(str(dead.pid))
    (stale / "rank0.pkl").write_bytes(b"left behind")
    mine = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    (mine / LAUNCHER_FILE).write_text(str(os.getpid()))  # a live launcher's: kept
    try:
        assert stale in remove_stale_folders()
        assert not stale.exists() and mine.is_dir()
    finally:
        shutil.rmtree(mine, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)


def _readme_loop(rank: int, world: int, folder: str, stop_file: str, steps: int) -> tuple[int, int, str]:
    """The README's training loop: Checkpointer and StopRequest around Pipeline.step."""
    from hintpipe.apps.models import build_layers, lm_loss, make_batch, split_layers
    from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
    from hintpipe.runtime.checkpoint.stopping import StopRequest
    from hintpipe.runtime.pipeline import Pipeline

    stages = split_layers(build_layers(MODEL), world)
    done = 0
    pipe = Pipeline.from_modules(stages, loss_fn=lm_loss, microbatches=2, policy="fixed")
    with pipe, StopRequest(stop_file) as stop:
        optimizer = torch.optim.AdamW([p for m in pipe.modules.values() for p in m.parameters()])
        checkpoints = Checkpointer(folder, pipe, optimizer, every=100)
        first = checkpoints.resume()
        for step in range(first, steps):
            inputs, targets, _ = make_batch(MODEL, 2, 2, SeqLenDist(8), step, 0)
            pipe.step(inputs, target=targets)
            optimizer.step()
            optimizer.zero_grad()
            done = step + 1
            stopping = stop.agreed()
            checkpoints.after_step(done, stopping=stopping)
            if stopping:
                break
    return first, done, stop.name


def test_the_readme_loop_stops_saved_and_resumes(tmp_path: Path) -> None:
    folder, stop_file = str(tmp_path / "ck"), tmp_path / "stop"
    stop_file.write_text(str(int(signal.SIGTERM)))  # as the launcher writes it on a signal
    first = run_ranks(_readme_loop, 2, folder, str(stop_file), 5, timeout=TIMEOUT)
    assert first == [(0, 1, "SIGTERM")] * 2  # every rank stopped after the same, first, step
    assert find_checkpoint(folder)[0] == tmp_path / "ck" / "step-00000001"
    stop_file.unlink()
    assert run_ranks(_readme_loop, 2, folder, str(stop_file), 3, timeout=TIMEOUT) == [(1, 3, "")] * 2


# -- elastic restarts under torchrun ----------------------------------------------------------------------------


def test_an_elastic_restart_resumes_and_ends_bitwisesame_tensors(tmp_path: Path) -> None:
    common = ["--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2", "--microbatches", "4"]
    common += ["--policy", "fixed", "--steps", "6", "--checkpoint-every", "1", "--json", "--timeout", str(TIMEOUT)]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    restarted, reference = tmp_path / "restarted", tmp_path / "reference"
    fault = ["--checkpoint-dir", str(restarted), "--resume", "--faults", "crash:1:3"]
    elastic = subprocess.run(
        [*torchrun, "--max-restarts", "1", "-m", "hintpipe", "train", *common, *fault],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT) * 2,
    )
    assert elastic.returncode == 0, elastic.stderr[-3000:]
    assert '"resumed_from": 3' in elastic.stdout  # the second attempt went on from the last checkpoint
    plain = subprocess.run(
        [sys.executable, "-m", "hintpipe", "train", *common, "--checkpoint-dir", str(reference)],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert same_tensors(load_merged(restarted / "step-00000006"), load_merged(reference / "step-00000006"))


def test_ranks_never_outlive_a_killed_torchrun_agent(tmp_path: Path) -> None:
    # SIGKILL to torchrun's agent once its ranks train (saving every step): both ranks end within seconds of the
    # kill, no checkpoint is published after it (listed at the kill, and again once the ranks are gone), and the
    # folder is free again (rank 0 held it). The output goes to a file: a pipe would be held open by a rank
    # left alive, and reading it would wait for that rank instead of failing.
    folder = tmp_path / "ck"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    argv = [*torchrun, "-m", "hintpipe", "train", *SMALL_CLI, "--steps", "100000", "--json"]
    log = (tmp_path / "agent.txt").open("w")
    agent = subprocess.Popen(
        [*argv, "--checkpoint-dir", str(folder), "--checkpoint-every", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + hang_bound(TIMEOUT)
        while not (folder / "latest").exists():
            assert agent.poll() is None, (tmp_path / "agent.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint was ever written"
            time.sleep(0.1)
        ranks = descendants(agent.pid)
        assert len(ranks) == 2
        agent.kill()
        killed = time.monotonic()
        at_kill = _published(folder)
        gone = _all_gone(ranks, within=15.0)
        ended_within = time.monotonic() - killed
        assert gone, f"ranks left training {ended_within:.0f} s after their agent died"
        assert _nothing_published_after(at_kill, _published(folder)), (at_kill, _published(folder))
    finally:
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        agent.kill()
        agent.wait(timeout=allow(15))
        log.close()
    from hintpipe.runtime.checkpoint.folder_lock import FolderInUse, FolderLock

    # The folder is free once the run's last process is: the lock goes with the process that held it, which the
    # kernel may still be ending a moment after its pid stopped answering (15 s, as for the ranks above).
    deadline = time.monotonic() + allow(15.0)
    while True:
        try:
            with FolderLock(folder) as lock:
                assert lock.held
            break
        except FolderInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
