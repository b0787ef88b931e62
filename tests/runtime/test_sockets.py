"""No listening socket beyond loopback: a run spawned on one machine opens none that another machine can reach
(see [Note: no listening socket beyond loopback] in hintpipe.runtime.launch)."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import allow, hang_bound
from processes import descendants

TIMEOUT = 20.0
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's state column


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:  # little-endian 32-bit word
        return ipaddress.IPv4Address(raw[::-1])
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))  # four little-endian words
    address = ipaddress.IPv6Address(words)
    return address.ipv4_mapped or address


def listening(pid: int) -> list[tuple[str, int]]:
    """The TCP sockets the process ``pid`` listens on, as (address, port): its socket inodes (``/proc/PID/fd``)
    looked up in ``/proc/PID/net/tcp`` and ``tcp6``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == LISTEN and inode in inodes:
                address, port = local.split(":")
                found.append((str(_address(address)), int(port, 16)))
    return sorted(found)


def test_a_spawned_run_listens_on_loopback_only(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "hintpipe", "train", "--model", "gpt-mini", "--layers", "2", "--hidden", "16"]
    argv += ["--ranks", "2", "--microbatches", "4", "--policy", "fixed", "--timeout", str(TIMEOUT), "--json"]
    argv += ["--steps", "100000", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "1"]
    run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + hang_bound(TIMEOUT)
        while not (tmp_path / "ck" / "latest").is_file():  # the ranks have met and train
            assert run.poll() is None and time.monotonic() < deadline, run.stderr
            time.sleep(0.1)
        ranks = descendants(run.pid)
        by_process = {pid: listening(pid) for pid in [run.pid, *ranks]}
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate(timeout=allow(30))
    assert by_process[run.pid] == []  # the launcher serves no store
    sockets = [s for pid in ranks for s in by_process[pid]]
    assert sockets, by_process  # gloo's own: the ranks do listen, so the lookup above sees sockets
    assert [s for s in sockets if not ipaddress.ip_address(s[0]).is_loopback] == [], by_process
