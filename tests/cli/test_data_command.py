"""``hintpipe data prepare`` (:mod:`hintpipe.cli.data`): sources tokenized once into a folder that ``train --data
DIR`` reads, its counts as JSON, and each refusal in one line naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import parse_cli
from hintpipe.cli import main
from hintpipe.cli.data import summary
from hintpipe.cli.train import config_from
from hintpipe.data.manifest import read_manifest


def _text(path: Path, count: int, tag: str = "d", separator: str = "\n\n") -> Path:
    """``count`` documents, each starting with its tag and number ("d007:"), of different lengths."""
    path.write_text(separator.join(f"{tag}{i:03d}:" + "ab" * (i % 7 + 1) for i in range(count)), encoding="utf-8")
    return path


def test_hintpipe_data_prepare_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _text(tmp_path / "a.txt", 30)
    out = tmp_path / "prepared"
    assert main(["data", "prepare", str(source), "--out", str(out), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["documents"], said["tokens"], said["dtype"], said["shards"]) == (
        30,
        read_manifest(out).tokens,
        "uint8",
        1,
    )
    assert said["tokens_per_s"] > 0 and said["sources"][0]["given"] == str(source)
    assert said == summary(read_manifest(out), str(out), said["prepare_time_s"])  # the manifest's own counts
    assert main(["data", "prepare", str(source), "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"hintpipe data: error: --out {out} is prepared already; give --replace to prepare it again, or a new folder\n"
    )
    assert main(["data", "prepare", str(out), "--out", str(tmp_path / "again")]) == 2
    assert (
        capsys.readouterr().err
        == f"hintpipe data: error: --data {out}: prepared already; train from it (--data {out})\n"
    )
    assert main(["data", "prepare", str(source), "--out", str(out), "--replace", "--data-split", " "]) == 2
    assert capsys.readouterr().err.startswith(
        "hintpipe data: error: --data-split ' ': a separator must have a character"
    )
    assert main(["data", "prepare", str(source), "--out", str(out), "--replace", "--data-split", "file"]) == 0
    assert read_manifest(out).documents == 1 and "prepared" in capsys.readouterr().out
    # train --data DIR takes the folder's own tokenizer; two --data flags are a mixture; a config file's list too.
    argv = ["train", "--ranks", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16"]
    assert main([*argv, "--data", str(out), "--data", f"{source}:3", "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert f'data = [\n    "{out}",\n    "{source}:3",\n]' in printed
    (tmp_path / "run.toml").write_text(printed)
    args = parse_cli([*argv, "--config", str(tmp_path / "run.toml")])
    config = config_from(args, args.policy)
    assert config.data.source == (str(out), f"{source}:3") and config.prepared[0] == str(out)
