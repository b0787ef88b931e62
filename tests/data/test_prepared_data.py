"""Data at the size users train on: sources tokenized once into memory-mapped shards (``hintpipe data
prepare``, or a run's first use), read by the documents a step draws, several sources mixed by weight, every
bad source refused in one line before any rank starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import hintpipe.data.reading
from hintpipe.apps.batches import held_out_batches
from hintpipe.apps.corpus import document_batch
from hintpipe.apps.model_config import ModelConfig
from hintpipe.apps.text_files import read_documents, text_corpus
from hintpipe.apps.training import HELD_OUT_STEP, TrainConfig, step_batch
from hintpipe.cli import main
from hintpipe.data.cache import CACHE_ENV
from hintpipe.data.manifest import Manifest, read_manifest, write_manifest
from hintpipe.data.prepare import prepare
from hintpipe.data.prepared import open_prepared
from hintpipe.data.refusal import DataRefused
from hintpipe.data.shards import ShardRecord, ShardWriter
from hintpipe.data.tokenizer import TokenizerIdentity
from hintpipe.forming.cost import SequenceCost

#: What a refusal of text that is not UTF-8 advises.
TO_UTF8 = "convert it to UTF-8 (iconv -f ENCODING -t UTF-8), as the tokenizer reads UTF-8"

MODEL = ModelConfig(vocab=256)


def _config(data: Any, **changes: Any) -> TrainConfig:
    return TrainConfig.of(**({"model": MODEL, "ranks": 2, "microbatches": 4, "data": data} | changes))


def _lists(documents: Any) -> list[list[int]]:
    return [np.asarray(documents[i]).tolist() for i in range(len(documents))]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _text(path: Path, count: int, tag: str = "d", separator: str = "\n\n") -> Path:
    """``count`` documents, each starting with its tag and number ("d007:"), of different lengths."""
    path.write_text(separator.join(f"{tag}{i:03d}:" + "ab" * (i % 7 + 1) for i in range(count)), encoding="utf-8")
    return path


def _corpus(root: Path) -> Path:
    """A folder of plain text (with CRLF, blank lines of spaces, non-ASCII) and JSONL, in two levels."""
    folder = root / "corpus"
    (folder / "sub").mkdir(parents=True)
    _text(folder / "b.txt", 45)
    (folder / "sub" / "c.txt").write_bytes(b"caf\xc3\xa9 one\r\nline two\r\n \t\r\n\r\nthird\rdoc\n\n\nx\n\nlast")
    _jsonl(folder / "a.jsonl", [{"text": f"record {i}" * (i % 3 + 1), "id": i} for i in range(30)])
    return folder


def _rows(inputs: list[Any]) -> list[torch.Tensor]:
    return [x[0] if isinstance(x, tuple) else x for x in inputs]


# -- tokenize once ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["blank", "file", "<|end|>"])
def test_prepare_then_read_gives_the_token_ids_of_tokenizing_in_memory(tmp_path: Path, split: str) -> None:
    folder = _corpus(tmp_path)
    if split == "<|end|>":
        _text(folder / "b.txt", 45, separator="<|end|>\n")
    # Shards of 100 tokens: a corpus of many shards, documents never across two.
    manifest = prepare([str(folder)], tmp_path / "prepared", split=split, shard_tokens=100)
    corpus = open_prepared(tmp_path / "prepared")
    memory = text_corpus(str(folder), split=split)
    assert _lists(corpus.documents) == _lists(memory.documents)
    assert _lists(corpus.training) == _lists(memory.training)
    assert _lists(corpus.held_out) == _lists(memory.held_out)
    assert len(manifest.shards) > 3 and manifest.documents == len(memory.documents)
    assert manifest.tokens == sum(len(d) for d in memory.documents)
    assert np.load(tmp_path / "prepared" / "tokens-00000.npy", mmap_mode="r").dtype == np.uint8  # bytes: 256 ids
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # the temporary folder renamed in
    documents = read_documents(str(folder), split=split)
    if split == "file":  # a file is one document, as written (line breaks read as universal newlines)
        assert documents[31] == "café one\nline two\n \t\n\nthird\ndoc\n\n\nx\n\nlast"  # after a.jsonl's and b.txt
    elif split == "blank":
        assert documents[-4:] == ("café one\nline two", "third\ndoc", "x", "last")


def test_files_are_read_in_blocks_with_the_same_documents_and_the_byte_s_own_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _corpus(tmp_path)
    expected = {split: read_documents(str(folder), split=split) for split in ("blank", "file", "<|end|>", "\\n\\nd0")}
    monkeypatch.setattr(hintpipe.data.reading, "BLOCK", 7)  # documents, separators and CRLF across blocks
    for split, documents in expected.items():
        assert read_documents(str(folder), split=split) == documents, split
    (tmp_path / "late.txt").write_bytes(b"first line\nsecond line\nthird \xff line")
    with pytest.raises(ValueError) as info:
        read_documents(str(tmp_path / "late.txt"))
    assert str(info.value) == f"{tmp_path}/late.txt: not UTF-8 text (byte 29: invalid start byte); {TO_UTF8}"


def test_a_tokenizer_folder_s_shards_hold_its_ids_in_16_bits(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    words = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.train_from_iterator(["the cat sat on the mat", "a dog"], trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]")
    fast.add_tokens([f"extra{i}" for i in range(300)])  # a vocabulary over 256: uint16
    fast.save_pretrained(str(tmp_path / "tok"))
    data = str(_jsonl(tmp_path / "c.jsonl", [{"text": "the cat sat extra299"}, {"text": "a dog on the mat"}]))
    manifest = prepare([data], tmp_path / "prepared", tokenizer=str(tmp_path / "tok"))
    assert (manifest.vocab, manifest.dtype) == (len(fast), "uint16")
    corpus = open_prepared(tmp_path / "prepared")
    assert _lists(corpus.documents) == _lists(text_corpus(data, tokenizer=str(tmp_path / "tok")).documents)
    assert corpus.documents[0][-1] == fast.convert_tokens_to_ids("extra299") > 255
    config = _config(str(tmp_path / "prepared"), tokenizer=str(tmp_path / "tok"), model=ModelConfig(vocab=len(fast)))
    assert config.model.vocab == len(fast)


# -- a prepared folder is what it was made from --------------------------------------------------------------


def test_a_changed_source_and_another_tokenizer_are_refused_by_exact_text(tmp_path: Path) -> None:
    source = _text(tmp_path / "a.txt", 30)
    out = tmp_path / "prepared"
    prepare([str(source)], out)
    assert _config(str(out)).prepared == (str(out),)
    os.utime(source, ns=(1, 1))  # touched, the same bytes: the same source
    _config(str(out))
    text = source.read_text()
    source.write_text(text.replace("d001:", "d00l:"))  # the same size, other bytes
    with pytest.raises(ValueError) as info:
        _config(str(out))
    assert str(info.value) == (
        f"data {out}: its source {source} changed since it was prepared ({source} has other bytes (its SHA-256 "
        f"differs)); prepare it again: hintpipe data prepare {source} --tokenizer bytes --out {out} --replace"
    )
    source.write_text(text + "\n\nmore")
    with pytest.raises(ValueError) as info:
        _config(str(out))
    size = source.stat().st_size
    assert str(info.value) == (
        f"data {out}: its source {source} changed since it was prepared ({source} is {size:,} bytes, was "
        f"{size - 6:,}); prepare it again: hintpipe data prepare {source} --tokenizer bytes --out {out} --replace"
    )
    source.unlink()  # the sources gone (the folder copied elsewhere): the shards are the data
    assert _config(str(out)).prepared == (str(out),)
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError) as info:
        _config(str(out), tokenizer=str(tokenizer))
    said = str(info.value)
    assert said.startswith(
        f"tokenizer {tokenizer}: {out} was prepared with tokenizer bytes, not this one ({tokenizer} "
    )
    assert said.endswith("); use that tokenizer (bytes), or prepare the sources again with this one")


def test_a_folder_with_a_file_added_is_a_changed_source(tmp_path: Path) -> None:
    folder = _corpus(tmp_path)
    out = tmp_path / "prepared"
    prepare([str(folder)], out)
    _text(folder / "sub" / "new.txt", 3)
    with pytest.raises(ValueError, match=rf"^data {out}: its source {folder} changed since it was prepared \("
                       rf"{folder}/sub/new.txt is new\); prepare it again: "):  # fmt: skip
        _config(str(out))
    (folder / "sub" / "new.txt").unlink()
    (folder / "b.txt").unlink()
    with pytest.raises(ValueError, match=rf"\({folder}/b.txt is gone\)"):
        _config(str(out))


def test_a_prepared_folder_s_split_and_field_are_its_own(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "c.jsonl", [{"body": f"document {i}"} for i in range(25)])
    out = tmp_path / "prepared"
    prepare([str(data)], out, field="body")
    assert _config(str(out)).prepared == (str(out),)  # the defaults: the folder's own
    with pytest.raises(ValueError) as info:
        _config(str(out), data_field="title")
    assert str(info.value) == (
        f"data_field title: {out} was prepared with --data-field body; leave it out (the folder's own), or prepare "
        "the sources again with --data-field title"
    )


# -- the same steps from a prepared folder, from raw files, and as 0.6 drew them -------------------------------


@pytest.mark.parametrize("forming", ["crop", "padded"])
def test_a_run_s_step_batches_from_a_prepared_folder_equal_those_from_the_raw_files(
    tmp_path: Path, forming: str
) -> None:
    folder = _corpus(tmp_path)
    prepare([str(folder)], tmp_path / "prepared", shard_tokens=64)
    extra: dict[str, Any] = {"forming": forming, "microbatch_size": 3}
    if forming == "padded":
        extra["sequence_cost"] = SequenceCost(1.0)
    raw, prepared = _config(str(folder), **extra), _config(str(tmp_path / "prepared"), **extra)
    assert raw.prepared != prepared.prepared  # the raw files read from the cache's folder
    memory = text_corpus(str(folder))
    for step in (0, 1, 5, HELD_OUT_STEP):
        from_raw, from_prepared = step_batch(raw, step), step_batch(prepared, step)
        for x, y in zip(_rows(from_raw[0]) + from_raw[1], _rows(from_prepared[0]) + from_prepared[1], strict=True):
            assert torch.equal(x, y)
        assert from_raw[2] == from_prepared[2]
        if forming == "crop":  # the documents 0.6 drew, held in memory
            documents = memory.held_out if step == HELD_OUT_STEP else memory.training
            inputs, targets, _ = document_batch(documents, 4, 3, step, 0, MODEL.max_seq_len)
            assert all(torch.equal(x, y) for x, y in zip(inputs + targets, from_raw[0] + from_raw[1], strict=True))


def test_step_k_s_batch_is_a_pure_function_of_the_config_and_k(tmp_path: Path) -> None:
    """What a resumed run draws at step k is what an uninterrupted one does, for one source and a mixture."""
    a, b = _text(tmp_path / "a.txt", 50, "a"), _text(tmp_path / "b.txt", 50, "b")
    for data in (str(a), (f"{a}:0.6", f"{b}:0.4")):
        first = [step_batch(_config(data), 7)[0]]
        for step in range(8):  # an uninterrupted run
            batch = step_batch(_config(data), step)[0]
        again = step_batch(_config(data, steps=100), 7)[0]  # a new process would make the same config
        for x, y, z in zip(first[0], batch, again, strict=True):
            assert torch.equal(x, y) and torch.equal(x, z)


def test_weighted_sources_are_drawn_in_the_weights_proportion(tmp_path: Path) -> None:
    a = _text(tmp_path / "a.txt", 200, "a")
    code = tmp_path / "code"
    code.mkdir()
    for i in range(30):
        (code / f"m{i:02d}.py").write_text(f"b = {i}\n\ndef f():\n    return b\n" * (i % 4 + 1))
    config = _config((f"{a}:0.7", f"{code}:0.3"), microbatches=10, data_split="file")

    def source(row: list[int]) -> str:
        """A row's source: a.txt, one document here (data_split file), a window of which has only its tags'
        characters and line breaks; a code file's row (its length, 29 or more) has spaces."""
        return "code" if b" " in bytes(row) else "a"

    counts = {"a": 0, "code": 0}
    for step in range(100):  # 1,000 micro-batches of 4 documents
        for x in step_batch(config, step)[0]:
            for row in x.tolist():
                counts[source(row)] += 1
    total = sum(counts.values())
    assert total == 4000
    assert abs(counts["a"] / total - 0.7) < 0.03 and abs(counts["code"] / total - 0.3) < 0.03
    held = step_batch(config, HELD_OUT_STEP)[0]  # the held-out batch mixes the held-out documents alike
    assert {source(row) for x in held for row in x.tolist()} == {"a", "code"}


# -- what a run reads ----------------------------------------------------------------------------------------


def _vm_rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def test_reading_a_step_s_batch_from_a_200_mb_corpus_leaves_the_process_s_memory_flat(tmp_path: Path) -> None:
    """Shards written directly (preparing 200 MB of text would take longer than the test should)."""
    folder = tmp_path / "big"
    folder.mkdir()
    rng = np.random.default_rng(0)
    lengths = rng.integers(1000, 7000, size=50_000)  # 200 MB of byte tokens in 50,000 documents
    header = {"descr": "|u1", "fortran_order": False}
    records = []
    for number, part in enumerate(np.array_split(lengths, 2)):
        name = f"tokens-{number:05d}.npy"
        with open(folder / name, "wb") as handle:
            np.lib.format.write_array_header_1_0(handle, header | {"shape": (int(part.sum()),)})
            for chunk in np.array_split(part, 20):
                handle.write(rng.integers(0, 256, size=int(chunk.sum()), dtype=np.uint8).tobytes())
        np.save(folder / f"offsets-{number:05d}.npy", np.concatenate([[0], np.cumsum(part)]).astype(np.int64))
        records.append(ShardRecord(name, f"offsets-{number:05d}.npy", len(part), int(part.sum())))
    manifest = Manifest(
        TokenizerIdentity("bytes"), "bytes", 256, "uint8", "blank", "text", (), len(lengths), int(lengths.sum()), 0,
        tuple(records),
    )  # fmt: skip
    write_manifest(folder, manifest)
    assert sum(p.stat().st_size for p in folder.iterdir()) > 200e6
    config = _config(str(folder), microbatches=8)
    step_batch(config, 1000)  # the first step's own allocations (torch's), apart from the corpus
    before = _vm_rss_kib()
    for step in range(10):
        inputs, _, _ = step_batch(config, step)
    grown = _vm_rss_kib() - before
    assert sum(x.numel() for x in inputs) == 8 * 4 * (MODEL.max_seq_len - 1)
    assert grown < 2 * 1024, f"reading 10 steps raised the process's memory by {grown} KiB"


def test_a_run_on_raw_files_prepares_them_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    source = _text(tmp_path / "a.txt", 30)
    first = _config(str(source)).prepared[0]
    assert Path(first).parent == tmp_path / "cache" / "data" and Path(first).name.startswith("a.txt-")
    stamp = (Path(first) / "manifest.json").stat().st_mtime_ns
    assert _config(str(source)).prepared[0] == first  # found, not prepared again
    assert (Path(first) / "manifest.json").stat().st_mtime_ns == stamp
    source.write_text(source.read_text() + "\n\nmore")  # another source: another folder, never the old shards
    second = _config(str(source)).prepared[0]
    assert second != first and read_manifest(Path(second)).documents == 31


# -- sources as users have them ------------------------------------------------------------------------------


def test_a_hugging_face_dataset_saved_or_in_local_files_is_streamed(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    texts = [f"row {i} " + "z" * (i % 5) for i in range(40)]
    datasets.Dataset.from_dict({"content": texts, "n": list(range(40))}).save_to_disk(str(tmp_path / "saved"))
    _jsonl(tmp_path / "part-0.jsonl", [{"content": t} for t in texts[:25]])
    _jsonl(tmp_path / "part-1.jsonl", [{"content": t} for t in texts[25:]])
    expected = [list(t.encode()) for t in texts]
    for data in (str(tmp_path / "saved"), f"hf:json:{tmp_path}/part-*.jsonl"):
        assert read_documents(data, field="content") == tuple(texts)
        config = _config(data, data_field="content")
        assert _lists(open_prepared(config.prepared[0]).documents) == expected
        with pytest.raises(ValueError) as info:
            _config(data)
        assert str(info.value) == (
            f"data {data}: no column 'text' (its columns: 'content'{', ' + repr('n') if 'saved' in data else ''}); "
            "name one with data_field"
        )
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts})}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError) as info:
        _config(str(tmp_path / "dd"))
    assert (
        str(info.value)
        == f"data {tmp_path}/dd: a saved DatasetDict; give one of its splits' folders ({tmp_path}/dd/train)"
    )


@pytest.mark.parametrize(
    ("files", "data", "message"),
    [
        ({}, "missing.txt", "{tmp}/missing.txt: no such file or folder"),
        ({"e.txt": b"\n \n\na\n"}, "e.txt", "{tmp}/e.txt: no document of 2 tokens or more (an empty corpus)"),
        ({"l.txt": b"fine\n\ncaf\xe9 au lait"}, "l.txt",
         "{tmp}/l.txt: not UTF-8 text (byte 9: invalid continuation byte); " + TO_UTF8),
        ({"c.jsonl": b'{"text": "ok"}\n{"body": "no"}\n'}, "c.jsonl",
         "{tmp}/c.jsonl, line 2: no field 'text' (its fields: 'body'){fix}"),
        ({"a.txt": b"one doc"}, "{tmp}/a.txt:-1",
         "{tmp}/a.txt:-1: the weight -1 must be a positive number (PATH:WEIGHT, e.g. {tmp}/a.txt:0.5)"),
        ({}, "hf:jsn:*.jsonl",
         "hf:jsn:*.jsonl: hf:BUILDER:FILES takes a builder of json, text, parquet, csv and the files, e.g. "
         "hf:parquet:data/*.parquet"),
        ({}, "hf:json:{tmp}/none-*.jsonl", "hf:json:{tmp}/none-*.jsonl: no file matches {tmp}/none-*.jsonl"),
    ],
)  # fmt: skip
def test_every_bad_source_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, bytes], data: str, message: str
) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    data = data if data.startswith(("{", "hf:")) else f"{{tmp}}/{data}"
    data = data.format(tmp=tmp_path)
    # A fix that names another option ({fix}) ends the line, that option named as the caller names it.
    python, cli = (message.format(tmp=tmp_path, fix=f"; name one with {o}") for o in ("data_field", "--data-field"))
    with pytest.raises(ValueError) as info:
        _config(data)
    assert str(info.value) == f"data {python}"
    with pytest.raises(DataRefused) as refused:
        prepare([data], tmp_path / "out")
    assert data.endswith(":-1") or str(refused.value) == message.format(tmp=tmp_path, fix="")
    assert not (tmp_path / "out").exists()
    argv = ["train", "--ranks", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16", "--data", data]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"hintpipe train: error: --data {cli}\n"


def test_a_preparation_stopped_part_way_leaves_nothing_that_looks_prepared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = _text(tmp_path / "a.txt", 30)

    def fail(self: ShardWriter, ids: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ShardWriter, "add", fail)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(source)], tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


# -- evaluation over fixed held-out batches ------------------------------------------------------------------


def test_eval_batches_are_fixed_held_out_documents_without_replacement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _text(tmp_path / "a.txt", 400, "a"), _text(tmp_path / "b.txt", 200, "b")  # 20 and 10 held out
    config = _config((str(a), str(b)), microbatches=2, microbatch_size=3, eval_batches=2, dp=2)
    held = {tuple(d) for f in config.prepared for d in _lists(open_prepared(f).held_out)}
    seen = []
    for replica in (0, 1):
        batches = held_out_batches(config, replica)
        assert len(batches) == 2 and _same(batches, config, replica)  # the same documents at every evaluation
        for inputs, targets, _ in batches:
            for x, y in zip(inputs, targets, strict=True):
                seen += [tuple(row[:4].tolist()) for row in x]
                assert torch.equal(x[:, 1:], y[:, :-1])
    assert len(seen) == 24 and len(set(seen)) == 24  # 2 batches x 2 replicas x 6 documents, none twice
    assert set(seen) <= {d[:4] for d in held} and {s[0] for s in seen} == {ord("a"), ord("b")}
    with pytest.raises(ValueError) as info:
        _config((str(a), str(b)), microbatches=2, microbatch_size=3, eval_batches=3, dp=2)
    assert str(info.value) == (
        "eval_batches 3 takes 36 held-out documents (3 x 2 micro-batches x 3 x 2 replicas, without replacement); "
        "the run's held-out split has 30: use eval_batches 2 or fewer"
    )
    argv = ["train", "--ranks", "2", "--microbatches", "2", "--layers", "2", "--hidden", "16", "--eval-batches", "1"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "hintpipe train: error: --eval-batches 1 evaluates on a file corpus's held-out documents; --data synthetic "
        "has none: leave --eval-batches out (each evaluation draws one batch)\n"
    )


def _same(batches: list[Any], config: TrainConfig, replica: int) -> bool:
    again = held_out_batches(config, replica)
    return all(
        torch.equal(x, y) for one, two in zip(batches, again, strict=True) for x, y in zip(one[0], two[0], strict=True)
    )


def test_a_run_s_held_out_loss_is_recomputed_from_its_export_with_the_public_api(tmp_path: Path) -> None:
    import json

    from safetensors.torch import load_file

    import hintpipe
    from hintpipe.apps.export import export_checkpoint
    from hintpipe.apps.models import loss_fn_for, whole_model
    from hintpipe.apps.training import train

    data = _text(tmp_path / "a.txt", 600)  # 30 held out: 3 batches of 4 x 2
    model = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=256, max_seq_len=32)
    config = _config(
        str(data), model=model, microbatch_size=2, steps=2, eval_every=2, eval_batches=3, timeout=120.0,
        policy="fixed", checkpoint_dir=str(tmp_path / "ck"),
    )  # fmt: skip
    result = train(config)
    assert result is not None
    # The model as the export writes it, rebuilt as its README says: nothing of the run but its config.
    export_checkpoint(tmp_path / "ck", tmp_path / "out")
    fields = json.loads((tmp_path / "out" / "hintpipe_model.json").read_text())
    whole = whole_model(ModelConfig(**fields))[0]
    whole.load_state_dict(load_file(str(tmp_path / "out" / "model.safetensors")), strict=True)
    whole.eval()
    loss_fn = loss_fn_for("gpt-mini")
    losses = []
    with torch.no_grad():
        for inputs, targets, _ in hintpipe.held_out_batches(result.config):
            losses.append(sum(float(loss_fn(whole(x), y)) for x, y in zip(inputs, targets, strict=True)) / len(inputs))
    assert [steps for steps, _ in result.eval_losses] == [2]
    assert result.eval_losses[0][1] == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_a_run_on_a_mixture_resumed_mid_run_draws_what_an_uninterrupted_run_draws(tmp_path: Path) -> None:
    # The loader's position is the step: a resumed run's steps draw the same documents from each source as an
    # uninterrupted run's, so it trains to the same losses, bitwise.
    from hintpipe.apps.training import train

    sources = (f"{_text(tmp_path / 'a.txt', 80, 'a')}:0.7", f"{_text(tmp_path / 'b.txt', 80, 'b')}:0.3")
    model = ModelConfig("gpt-mini", layers=2, hidden=16, heads=2, vocab=256, max_seq_len=32)
    common = {"model": model, "microbatch_size": 2, "timeout": 120.0, "policy": "fixed"}
    straight = train(_config(sources, steps=4, **common))
    folder = str(tmp_path / "ck")
    first = train(_config(sources, steps=2, checkpoint_dir=folder, **common))
    resumed = train(_config(sources, steps=4, checkpoint_dir=folder, resume=True, **common))
    assert straight is not None and first is not None and resumed is not None
    assert resumed.resumed_from == 2
    assert first.losses + resumed.losses == straight.losses
