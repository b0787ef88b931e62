"""Under ``torchrun``: a held folder refused before the ranks meet, ranks of a process group the user made
tied to the agent, and the rendezvous on loopback only (issue 51's probe)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import allow, hang_bound
from hintpipe.runtime.checkpoint.folder_lock import FolderLock, describe
from processes import descendants

TIMEOUT = 20.0
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
TRAIN = ["-m", "hintpipe", "train", "--model", "gpt-mini", "--layers", "2", "--hidden", "16", "--ranks", "2"]
TRAIN += ["--microbatches", "2", "--microbatch-size", "2", "--policy", "fixed", "--timeout", str(TIMEOUT)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def _published(folder: Path) -> list[int]:
    """The steps of the checkpoints published in ``folder`` (renamed into place; ``.tmp`` ones are not)."""
    return sorted(int(p.name.removeprefix("step-")) for p in folder.glob("step-*") if p.name[5:].isdigit())


def test_a_second_run_in_a_held_folder_under_torchrun_is_one_line_from_rank_0_before_the_ranks_meet(
    tmp_path: Path,
) -> None:
    # Before: every rank failed in the run's start with a traceback and "CheckpointError: starting a run in D
    # failed (rank 0: D is in use ...)", 98 lines with torchrun's report, rank 0's exit status 1.
    folder = tmp_path / "ck"
    with FolderLock(folder):
        holder = describe(json.loads((folder / "run.lock").read_text()))
        done = subprocess.run(
            [*TORCHRUN, *TRAIN, "--steps", "2", "--checkpoint-dir", str(folder), "--json"],
            capture_output=True,
            text=True,
            timeout=hang_bound(TIMEOUT),
        )
        assert sorted(p.name for p in folder.iterdir()) == ["run.lock"]  # nothing written, the lock still ours
        assert describe(json.loads((folder / "run.lock").read_text())) == holder
    said = (
        f"hintpipe train: error: --checkpoint-dir {folder} is in use by another run ({holder}, holding "
        f"{folder}/run.lock); wait for it to end or stop it, or use another checkpoint folder"
    )
    lines = done.stderr.splitlines()
    ours = [line for line in lines if line.startswith(("hintpipe train", "  traceback : hintpipe"))]
    assert ours == [said, f"  traceback : {said}"], done.stderr  # rank 0's line, and torchrun's report of it
    assert "CheckpointError" not in done.stderr
    root_cause = done.stderr.split("Root Cause (first observed failure):")[1]
    assert re.search(r"rank      : 0 \(local_rank: 0\)\n  exitcode  : 2 \(pid: \d+\)", root_cause), root_cause
    assert done.returncode == 1  # torchrun's own status whenever a rank fails
    assert done.stdout == ""


def test_a_rank_s_error_under_torchrun_is_its_one_line_and_torchrun_s_report_of_it() -> None:
    # Before ([Note: a torchrun rank's error] in hintpipe.runtime.launch): each rank's error came out as a traceback
    # ending "hintpipe.runtime.errors.NonFiniteLoss: ..." (three tracebacks in all), and torchrun's report said
    # "To enable traceback see ..." for each rank.
    done = subprocess.run(
        [*TORCHRUN, *TRAIN, "--steps", "3", "--faults", "nan:1"],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert done.returncode == 1, done.stderr[-3000:]
    words = (
        "rank 1: the loss of micro-batch 0 in step 1 is nan; the step stops before the optimizer runs "
        "(on_nonfinite='skip' finishes it and zeroes the gradients)"
    )
    said = {
        0: f"hintpipe train: failed: rank 0: PeerFailure: rank 0: rank 1 failed in step 1; it said: {words}",
        1: f"hintpipe train: failed: rank 1: NonFiniteLoss: {words}",
    }
    # Each rank says its line, and leaves it for torchrun's report first; the rank that ends second may be stopped
    # by torchrun (SIGTERM) before it says it, or even before it leaves it (its report then names the signal).
    lines = done.stderr.splitlines()
    ours = [line for line in lines if line.startswith("hintpipe train")]
    assert all(line in said.values() or "SIGTERM" in line for line in ours), ours  # or a rank torchrun stopped
    reported = [line.removeprefix("  traceback : ") for line in lines if line.startswith("  traceback : ")]
    assert reported and all(r in said.values() or r.startswith("Signal 15 (SIGTERM)") for r in reported), reported
    assert set(said.values()) & set(ours + reported), done.stderr[-3000:]
    assert "hintpipe.runtime.errors" not in done.stderr and "To enable traceback" not in done.stderr, done.stderr[
        -3000:
    ]


#: Rank 0 works (sleeps) before it joins, as the command line's rank 0 plans a model; ``planning`` beats meanwhile.
LATE_RANK_0 = """
import os
import sys
import time

from hintpipe import run_ranks
from hintpipe.runtime.rank_process import planning_heartbeat


def rank_main(rank, world):
    return rank


if __name__ == "__main__":
    if os.environ["RANK"] == "0":
        with planning_heartbeat():
            time.sleep(float(sys.argv[1]))
    print(run_ranks(rank_main, 2, timeout=30, device="cpu"))
"""


def test_the_ranks_wait_for_a_rank_0_that_plans_longer_than_their_timeout(tmp_path: Path) -> None:
    # [Note: a rank that plans before it joins]: before, rank 1 waited 30 s (its least wait at the start) for a rank
    # 0 still planning, and ended: "rank 0 never joined the run (waited 30 s for it at the start: ...)".
    script = tmp_path / "late.py"
    script.write_text(LATE_RANK_0)
    done = subprocess.run(
        [*TORCHRUN, str(script), "36"], capture_output=True, text=True, timeout=hang_bound(120), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("[0, 1]") == 2, done.stdout  # every rank's results (their lines may interleave)


#: A training script of the user's own: its process group, a Pipeline, a Checkpointer saving every step.
USER_SCRIPT = """
import sys

import torch
import torch.distributed as dist

from hintpipe.apps.models import ModelConfig, SeqLenDist, build_layers, lm_loss, make_batch, split_layers
from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
from hintpipe.runtime.pipeline import Pipeline

torch.set_num_threads(1)
dist.init_process_group("gloo")
model = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=32, max_seq_len=64)
pipe = Pipeline.from_modules(split_layers(build_layers(model), 2), loss_fn=lm_loss, microbatches=2, policy="fixed")
with pipe:
    optimizer = torch.optim.AdamW([p for m in pipe.modules.values() for p in m.parameters()])
    checkpoints = Checkpointer(sys.argv[1], pipe, optimizer, every=1, keep=1000)
    checkpoints.start()
    for step in range(100000):
        inputs, targets, _ = make_batch(model, 2, 2, SeqLenDist(8), step, 0)
        pipe.step(inputs, target=targets)
        optimizer.step()
        optimizer.zero_grad()
        checkpoints.after_step(step + 1)
"""


def test_ranks_of_a_users_own_process_group_end_with_the_torchrun_agent_and_publish_nothing_after(
    tmp_path: Path,
) -> None:
    # Before: only ranks started through run_ranks were tied to the agent; these trained on after SIGKILL to
    # it, rank 0 publishing a checkpoint every step.
    folder = tmp_path / "ck"
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(USER_SCRIPT))
    log = (tmp_path / "out.txt").open("w")  # a file, not a pipe: no wait on the ranks' end to read it
    agent = subprocess.Popen(
        [*TORCHRUN, str(script), str(folder)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + hang_bound(TIMEOUT)
        while len(_published(folder)) < 2:  # training, and saving every step
            assert agent.poll() is None, (tmp_path / "out.txt").read_text()
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.1)
        ranks = descendants(agent.pid)
        assert len(ranks) == 2
        agent.kill()
        killed = time.monotonic()
        at_kill = _published(folder)
        while any(_alive(p) for p in ranks) and time.monotonic() - killed < 15.0:
            time.sleep(0.1)
        ended_within = time.monotonic() - killed
        assert ended_within < 15.0, f"ranks still alive {ended_within:.0f} s after their agent was killed"
        # A save past its last check when the agent died may land: at most that one step beyond the newest.
        assert max(_published(folder)) <= max(at_kill) + 1, (at_kill, _published(folder))
    finally:
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        agent.kill()
        agent.wait(timeout=allow(15))
        log.close()


README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_loopback_command() -> str:
    """The README's torchrun in a network namespace of its own (its one ``unshare`` block)."""
    blocks: list[str] = re.findall(r"^\s*```bash\n(.*?)^\s*```", README.read_text(), flags=re.DOTALL | re.MULTILINE)
    (block,) = [b.strip() for b in blocks if "unshare -rn" in b]
    return block


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports listened on in the network namespace of process ``pid`` (its /proc/PID/net/tcp{,6})."""
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _interfaces(pid: int) -> list[str]:
    """The network interfaces of process ``pid``'s namespace."""
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    return sorted(line.split(":")[0].strip() for line in lines)


def test_the_readme_s_torchrun_in_a_namespace_of_its_own_listens_where_nothing_outside_reaches(
    tmp_path: Path,
) -> None:
    # torchrun's stores listen on every interface whatever its flags say (torch 2.13): its namespace then has
    # loopback alone, and the machine's own network namespace holds none of the run's listening sockets.
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=allow(30)).returncode != 0:
        pytest.skip("unprivileged user and network namespaces are not allowed here")
    command = _readme_loopback_command()
    assert command.startswith("unshare -rn sh -c '") and command.endswith("'")
    folder = tmp_path / "ck"
    extra = f" --layers 2 --hidden 16 --steps 100000 --checkpoint-dir {folder} --checkpoint-every 1 --json"
    command = command.replace("exec torchrun", f"exec {sys.executable} -m torch.distributed.run")[:-1] + extra + "'"
    log = (tmp_path / "out.txt").open("w")
    shell = subprocess.Popen(command, shell=True, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + hang_bound(TIMEOUT)
        while not (folder / "latest").exists():  # training
            assert shell.poll() is None, (tmp_path / "out.txt").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.1)
        tree = descendants(shell.pid)
        agent = next(p for p in tree if b"torch.distributed.run" in Path(f"/proc/{p}/cmdline").read_bytes())
        ranks = [p for p in tree if b"hintpipe" in Path(f"/proc/{p}/cmdline").read_bytes() and p != agent]
        assert len(ranks) == 2
        assert _interfaces(agent) == ["lo"]
        environ = dict(
            entry.split(b"=", 1) for entry in Path(f"/proc/{ranks[0]}/environ").read_bytes().split(b"\0") if entry
        )
        assert int(environ[b"MASTER_PORT"]) in _listening_ports(agent)  # the agent's store, in its namespace
        outside = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=allow(30)).stdout
        held = [line for line in outside.splitlines() if any(f"pid={p}," in line for p in tree)]
        assert held == []  # nothing of the run listens in this machine's network namespace
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(timeout=allow(15))
        log.close()


def test_torchrun_as_the_first_process_of_its_namespace_trains_as_the_command_line_s_own_launcher(
    tmp_path: Path,
) -> None:
    # A container's entry point: torchrun is PID 1 of its namespace, and its ranks' parent. Before: every rank
    # took its parent, PID 1, for init (its agent gone) and exited with status 1 at once, saying nothing.
    if (
        subprocess.run(["unshare", "-rfp", "--mount-proc", "true"], capture_output=True, timeout=allow(30)).returncode
        != 0
    ):
        pytest.skip("unprivileged user and PID namespaces are not allowed here")
    run = [*TRAIN, "--steps", "2", "--json"]
    first = subprocess.run(
        ["unshare", "-rfp", "--mount-proc", *TORCHRUN, *run],
        capture_output=True,
        text=True,
        timeout=hang_bound(TIMEOUT),
    )
    assert first.returncode == 0, first.stderr[-3000:]
    own = subprocess.run([sys.executable, *run], capture_output=True, text=True, timeout=hang_bound(TIMEOUT))
    assert own.returncode == 0, own.stderr[-3000:]
    losses = json.loads(first.stdout)["losses"]
    assert len(losses) == 2 and losses == json.loads(own.stdout)["losses"]
