"""One word for each concept: names retired in 0.7 appear nowhere in the code, the tests, the benchmarks or
the README, and a retired keyword still works for a release, with a ``DeprecationWarning`` naming the new
one (CHANGELOG: "Renamed")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hintpipe.runtime.launch import run_ranks

ROOT = Path(__file__).resolve().parents[1]

#: Retired spelling -> the pattern that finds it (a call of the public API with the old keyword).
RETIRED = {
    "run_ranks(timeout_s=...), now run_ranks(timeout=...)": re.compile(
        r"\brun_ranks\((?:[^()]|\([^()]*\))*?\btimeout_s=", re.S
    ),
}


def _sources() -> list[Path]:
    found = [ROOT / "README.md"]
    for folder in ("src", "tests", "benchmarks", "scripts"):
        found += sorted((ROOT / folder).rglob("*.py"))
    keeper = ROOT / "src/hintpipe/runtime/launch.py"  # takes the retired keyword and names it in its warning
    return [path for path in found if path.name != Path(__file__).name and path != keeper]


def test_retired_names_are_used_nowhere() -> None:
    used = [
        f"{path.relative_to(ROOT)}: {what}"
        for path in _sources()
        for what, pattern in RETIRED.items()
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert used == []


def _rank(rank: int, world: int) -> int:
    return rank + world


def test_a_retired_keyword_still_works_and_says_its_new_name() -> None:
    with pytest.warns(DeprecationWarning, match=r"^run_ranks\(timeout_s=\.\.\.\) is now run_ranks\(timeout=\.\.\.\)$"):
        assert run_ranks(_rank, 1, timeout_s=60, device="cpu") == [1]
