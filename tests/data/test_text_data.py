"""The user's own text: plain-text, JSONL and folder corpora, tokenized by bytes or a Hugging Face tokenizer
folder, every 20th document held out; from the command line, a config file and Python alike."""

from __future__ import annotations

import ast
import gzip
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import hintpipe
from conftest import parse_cli
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.text_files import text_corpus
from hintpipe.apps.training import HELD_OUT_STEP, TrainConfig, step_batch
from hintpipe.cli import main
from hintpipe.cli.train import config_from
from hintpipe.forming.cost import SequenceCost

#: What a refusal of text that is not UTF-8 advises.
TO_UTF8 = "convert it to UTF-8 (iconv -f ENCODING -t UTF-8), as the tokenizer reads UTF-8"

RUN = ["train", "--ranks", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16"]


def _lists(corpus_documents: Any) -> list[list[int]]:
    return [d.tolist() for d in corpus_documents]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _config(argv: list[str]) -> TrainConfig:
    args = parse_cli(argv)
    return config_from(args, args.policy)


def _numbered(path: Path, count: int) -> Path:
    """``count`` documents, each starting with its own number ("d07:"), of different lengths."""
    path.write_text("\n\n".join(f"d{i:02d}:" + "ab" * (i % 7 + 2) for i in range(count)))
    return path


def test_training_steps_draw_the_training_documents_and_the_held_out_batch_the_held_out_ones(
    tmp_path: Path,
) -> None:
    path = str(_numbered(tmp_path / "numbered.txt", 40))
    corpus = text_corpus(path)
    assert [bytes(d[:4].tolist()) for d in corpus.held_out] == [b"d19:", b"d39:"]
    config = TrainConfig.of(model=ModelConfig(vocab=256), ranks=2, microbatches=4, data=path)

    def starts(step: int, formed: TrainConfig = config) -> set[bytes]:
        inputs, _, _ = step_batch(formed, step)
        rows = [row for x in inputs for row in (x[0] if isinstance(x, tuple) else x)]
        return {bytes(row[:4].tolist()) for row in rows}

    trained = {start for step in range(20) for start in starts(step)}
    assert len(trained) > 20 and not trained & {b"d19:", b"d39:"}
    assert starts(HELD_OUT_STEP) == {b"d19:", b"d39:"}
    padded = TrainConfig.of(
        model=ModelConfig(vocab=256),
        ranks=2,
        microbatches=4,
        data=path,
        forming="padded",
        sequence_cost=SequenceCost(1.0),
    )
    assert starts(HELD_OUT_STEP, padded) == {b"d19:", b"d39:"}
    assert not {start for step in range(5) for start in starts(step, padded)} & {b"d19:", b"d39:"}


@pytest.mark.parametrize(
    ("files", "data", "message"),
    [
        ({}, "missing.txt", "missing.txt: no such file or folder"),
        ({"c.jsonl": b'{"text": "ok"}\n{"text": "cut\n'}, "c.jsonl",
         "c.jsonl, line 2: not JSON (Unterminated string starting at, column 10)"),
        ({"c.jsonl": b'{"text": "ok"}\n["text"]\n'}, "c.jsonl", "c.jsonl, line 2: a JSON array, not an object"),
        ({"c.jsonl": b'{"text": "ok"}\n{"txt": "no", "n": 2}\n'}, "c.jsonl",
         "c.jsonl, line 2: no field 'text' (its fields: 'txt', 'n'){fix}"),
        ({"c.jsonl": b'{"text": 3}\n'}, "c.jsonl", "c.jsonl, line 1: field 'text' is a JSON number, not a string"),
        ({"e.txt": b"\n\na\n \n\nb"}, "e.txt", "e.txt: no document of 2 tokens or more (an empty corpus)"),
        ({"d/notes.md": b"text"}, "d",
         "d: a folder without a file of .txt, .jsonl, .ndjson, .parquet, .csv, .tsv in it"),
        ({"l.txt": b"caf\xe9 au lait"}, "l.txt",
         "l.txt: not UTF-8 text (byte 3: invalid continuation byte); " + TO_UTF8),
    ],
)  # fmt: skip
def test_bad_data_is_refused_in_one_line_naming_the_path(
    tmp_path: Path, files: dict[str, bytes], data: str, message: str
) -> None:
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(content)
    # A fix that names another option ({fix}) ends the line, that option named as the caller names it.
    with pytest.raises(ValueError) as info:
        text_corpus(str(tmp_path / data), cli=True)
    assert str(info.value) == f"--data {tmp_path}/{message.format(fix='; name one with --data-field')}"
    with pytest.raises(ValueError) as info:
        TrainConfig.of(model=ModelConfig(vocab=256), ranks=2, microbatches=2, data=str(tmp_path / data))
    assert str(info.value) == f"data {tmp_path}/{message.format(fix='; name one with data_field')}"


def test_bad_data_on_the_command_line_exits_2_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _jsonl(tmp_path / "c.jsonl", [{"text": "ok"}, {"body": "no"}])
    assert main([*RUN, "--data", str(path)]) == 2
    assert (
        capsys.readouterr().err
        == f"hintpipe train: error: --data {path}, line 2: no field 'text' (its fields: 'body'); name one with "
        "--data-field\n"
    )
    assert main([*RUN, "--data", str(path), "--data-field", "body"]) == 2
    assert "line 1: no field 'body' (its fields: 'text')" in capsys.readouterr().err
    assert main([*RUN, "--model", "mlp", "--data", str(_numbered(tmp_path / "n.txt", 3))]) == 2
    assert f"--data {tmp_path}/n.txt is text: use a language model" in capsys.readouterr().err
    assert main([*RUN, "--forming", "padded"]) == 2
    assert "use it with --data stdlib or --data PATH" in capsys.readouterr().err


def test_a_tokenizer_that_is_not_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = str(_numbered(tmp_path / "n.txt", 3))
    missing = tmp_path / "no-tokenizer"
    with pytest.raises(ValueError) as info:
        text_corpus(data, tokenizer=str(missing), cli=True)
    assert str(info.value) == (
        f"--tokenizer {missing}: no such folder (the tokenizer is bytes, or a folder a Hugging Face tokenizer was "
        "saved to)"
    )
    for given in ("stdlib", data):  # a field only a JSONL file has, never silently ignored
        with pytest.raises(ValueError) as info:
            TrainConfig.of(model=ModelConfig(vocab=256), ranks=2, microbatches=2, data=given, data_field="body")
        assert str(info.value) == (
            f"data_field body names a record's field; data {given} has no records (JSON, Parquet, CSV)"
        )
    with pytest.raises(ValueError, match=r"^tokenizer bytes-ish tokenizes a data file or folder; data stdlib has "):
        TrainConfig.of(model=ModelConfig(vocab=256), ranks=2, microbatches=2, data="stdlib", tokenizer="bytes-ish")
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # not installed
    with pytest.raises(ValueError) as info:
        text_corpus(data, tokenizer=str(empty), cli=True)
    assert str(info.value) == f"--tokenizer {empty}: a tokenizer folder needs transformers: pip install -e '.[hf]'"
    monkeypatch.undo()
    pytest.importorskip("transformers")
    with pytest.raises(ValueError) as info:
        text_corpus(data, tokenizer=str(empty))
    assert str(info.value).startswith(f"tokenizer {empty}: not a folder a Hugging Face tokenizer was saved to (")
    assert "\n" not in str(info.value)


SENTENCES = ["the cat sat on the mat", "a dog sat on a log", "the dog and the cat"]


def _tokenizer_folder(path: Path) -> Any:
    """A word-level tokenizer trained on a few sentences, saved as ``save_pretrained`` saves one (no network)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    words = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator(SENTENCES, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[PAD]"]))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]", pad_token="[PAD]")
    tokenizer.save_pretrained(str(path))
    return tokenizer


def test_a_tokenizer_folder_gives_the_tokenizer_s_own_ids_and_vocabulary(tmp_path: Path) -> None:
    tokenizer = _tokenizer_folder(tmp_path / "tokenizer")
    texts = ["the cat sat on the mat", "a dog and a fish", "cat"]  # "cat" is 1 token: left out
    data = str(_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in texts]))
    corpus = text_corpus(data, tokenizer=str(tmp_path / "tokenizer"))
    assert _lists(corpus.documents) == [tokenizer(t)["input_ids"] for t in texts[:2]]
    assert corpus.vocab == len(tokenizer) and max(max(d) for d in _lists(corpus.documents)) < corpus.vocab
    assert text_corpus(data) is not corpus  # keyed by the tokenizer too
    sequences = hintpipe.token_sequences(data, tokenizer=str(tmp_path / "tokenizer"), max_len=3)
    assert [s.tolist() for s in sequences] == [ids[:4] for ids in _lists(corpus.documents)]
    config = _config([*RUN, "--data", data, "--tokenizer", str(tmp_path / "tokenizer")])
    assert (config.data.source, config.data.tokenizer, config.model.vocab) == (
        data,
        str(tmp_path / "tokenizer"),
        len(tokenizer),
    )
    inputs, _, _ = step_batch(config, 0)
    assert int(max(x.max() for x in inputs)) < len(tokenizer)


def _tokenizer_with_code(folder: Path, marker: Path, file: str) -> None:
    """A saved tokenizer whose ``file`` maps to a Python file of the folder's own that writes ``marker`` when it
    is imported: in ``tokenizer_config.json``, AutoTokenizer's class; in ``config.json``, AutoConfig's."""
    _tokenizer_folder(folder)
    ran = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    if file == "tokenizer_config.json":
        said = json.loads((folder / file).read_text())
        said |= {"tokenizer_class": "OwnTokenizer", "auto_map": {"AutoTokenizer": [None, "own.OwnTokenizer"]}}
        (folder / file).write_text(json.dumps(said))
        (folder / "own.py").write_text(
            ran + "import transformers\nclass OwnTokenizer(transformers.PreTrainedTokenizerFast): ...\n"
        )
    else:
        (folder / file).write_text(json.dumps({"model_type": "own", "auto_map": {"AutoConfig": "own.OwnConfig"}}))
        (folder / "own.py").write_text(
            ran + "import transformers\nclass OwnConfig(transformers.PretrainedConfig): ...\n"
        )


@pytest.mark.parametrize("file", ["tokenizer_config.json", "config.json"])
def test_a_tokenizer_folder_that_maps_to_its_own_code_is_refused_and_runs_nothing(
    file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, transformers asked on stdin whether to run the folder's code: a "y" ran it in the launcher, an open
    # stdin waited 15 s, and the question was printed on stdout. Now the folder is refused before transformers
    # reads it (and every from_pretrained passes trust_remote_code=False).
    folder, marker = tmp_path / "tokenizer", tmp_path / "ran"
    _tokenizer_with_code(folder, marker, file)
    data = str(_numbered(tmp_path / "n.txt", 3))
    refused = (
        f"{folder}: its {file} maps to Python code in the folder (auto_map), and hintpipe runs no code from a "
        "tokenizer folder; use a tokenizer class that transformers ships"
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))  # the answer that ran the code
    with pytest.raises(ValueError) as info:
        text_corpus(data, tokenizer=str(folder), cli=True)
    assert str(info.value) == f"--tokenizer {refused}"
    reading, writing = os.pipe()  # a stdin open and silent: no answer ever comes
    with os.fdopen(reading) as silent, os.fdopen(writing, "w"):
        monkeypatch.setattr(sys, "stdin", silent)
        started = time.monotonic()
        assert main([*RUN, "--data", data, "--tokenizer", str(folder)]) == 2
        waited = time.monotonic() - started
    said = capsys.readouterr()
    assert said.err == f"hintpipe train: error: --tokenizer {refused}\n"
    assert said.out == ""  # no question asked
    assert waited < 5.0, waited  # transformers' question waited 15 s
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.txt", "tokenizer"]


def test_every_from_pretrained_of_hintpipe_runs_no_code_from_a_folder() -> None:
    # transformers asks on stdin before it runs a folder's code where trust_remote_code is left out.
    calls = []
    for path in sorted(Path(hintpipe.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr in ("from_pretrained", "from_config"):
                trust = {k.arg: k.value for k in node.keywords}.get("trust_remote_code")
                calls.append((path.name, isinstance(trust, ast.Constant) and trust.value is False))
    assert sorted(calls) == [
        ("hf_folder.py", True),
        ("hf_folder.py", True),
        ("hf_folder.py", True),
        ("tokenizer.py", True),
    ]


def test_the_command_line_and_a_config_file_make_the_same_run(tmp_path: Path) -> None:
    data = str(_jsonl(tmp_path / "c.jsonl", [{"body": "some text"}, {"body": "more text"}]))
    config = _config([*RUN, "--data", data, "--data-field", "body"])
    assert (config.data.source, config.data.field, config.data.tokenizer, config.model.vocab) == (
        data,
        "body",
        "bytes",
        256,
    )
    assert _config([*RUN, "--data", "stdlib"]).model.vocab == 256
    assert _config(RUN).model.vocab == ModelConfig.vocab and _config(RUN).data.source == "synthetic"
    path = tmp_path / "run.toml"
    path.write_text(f'[data]\ndata = "{data}"\ndata_field = "body"\ntokenizer = "bytes"\n')
    assert _config([*RUN, "--config", str(path)]) == config
    path.write_text("[data]\ndata = 3\n")
    with pytest.raises(ValueError) as refused:
        _config([*RUN, "--config", str(path)])
    assert str(refused.value) == f"--config {path}: [data] data: --data must be a list of strings, got 3"


def test_python_takes_the_same_data_and_refuses_a_model_too_small_for_it(tmp_path: Path) -> None:
    data = str(_numbered(tmp_path / "n.txt", 3))
    config = TrainConfig.of(model=ModelConfig(vocab=256), ranks=2, microbatches=2, data=data, tokenizer="bytes")
    assert config.data.source == data
    with pytest.raises(ValueError) as info:
        TrainConfig.of(model=ModelConfig(), ranks=2, microbatches=2, data=data)
    assert str(info.value) == (
        f"data {data!r} has token ids up to 255 (tokenizer bytes); gpt-mini's vocabulary is 128: use "
        "ModelConfig(vocab=256)"
    )
    with pytest.raises(ValueError, match=r"^data 'stdlib' is text: use a language model"):
        TrainConfig.of(model=ModelConfig("mlp"), ranks=2, microbatches=2, data="stdlib")
    sequences = hintpipe.token_sequences(data)
    assert all(s.dtype == torch.int64 and s.dim() == 1 for s in sequences)
    batch = hintpipe.form_batch(sequences, 2, SequenceCost(1.0))
    assert batch.tokens == sum(s.numel() - 1 for s in sequences)


def test_training_on_a_jsonl_file_with_held_out_evaluations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = [{"text": f"document {i}: " + "lorem ipsum " * (i % 5 + 1)} for i in range(40)]
    data = str(_jsonl(tmp_path / "corpus.jsonl", records))
    argv = [*RUN, "--data", data, "--microbatch-size", "2", "--steps", "2", "--eval-every", "2", "--check-grads"]
    assert main([*argv, "--timeout", "120", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["losses"]) == 2 and out["max_grad_rel_diff"] < 1e-4
    assert [e["steps"] for e in out["eval_losses"]] == [2]


def test_a_corpus_as_json_lines_a_json_array_or_compressed_is_the_same_corpus(tmp_path: Path) -> None:
    records = [{"text": f"document {i}: " + "ab" * i} for i in range(40)]
    lines = _jsonl(tmp_path / "c.jsonl", records)
    (tmp_path / "c.json").write_text(json.dumps(records))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(lines.read_bytes()))
    reference = text_corpus(str(lines))
    for name in ("c.json", "c.jsonl.gz"):
        corpus = text_corpus(str(tmp_path / name))
        assert _lists(corpus.documents) == _lists(reference.documents), name
        assert _lists(corpus.held_out) == _lists(reference.held_out), name
