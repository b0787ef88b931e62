"""What ``--data`` names (:mod:`hintpipe.data.sources`): an entry and its weight, the kind of source its path is,
the files it reads in order, and each refusal in one line naming the path."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import pickle
from pathlib import Path

import pytest

from hintpipe.data.reading import read_blocks
from hintpipe.data.refusal import FIELD_FIX, DataRefused
from hintpipe.data.sources import DataEntry, Source, SourceKind, data_entries
from hintpipe.data.split import DocumentSplit

BLANK, BY_FILE = DocumentSplit.parse("blank"), DocumentSplit.parse("file")


def test_an_entry_is_a_path_and_a_weight_and_a_path_of_its_own_colons_is_kept(tmp_path: Path) -> None:
    assert DataEntry.parse("a.jsonl:0.7") == DataEntry("a.jsonl:0.7", "a.jsonl", 0.7)
    assert DataEntry.parse("a.jsonl") == DataEntry("a.jsonl", "a.jsonl", 1.0)
    assert DataEntry.parse("hf:json:data/*.jsonl") == DataEntry("hf:json:data/*.jsonl", "hf:json:data/*.jsonl")
    odd = tmp_path / "notes:2"  # a file whose name ends as a weight would: a path as it exists
    odd.write_text("x")
    assert DataEntry.parse(str(odd)).weight == 1.0


@pytest.mark.parametrize("weight", ["0", "-1", "inf", "nan"])
def test_a_weight_that_is_not_a_positive_number_is_refused(weight: str) -> None:
    with pytest.raises(DataRefused) as refused:
        DataEntry.parse(f"a.jsonl:{weight}")
    assert str(refused.value.said(cli=True)) == (
        f"--data a.jsonl:{weight}: the weight {weight} must be a positive number (PATH:WEIGHT, e.g. a.jsonl:0.5)"
    )


def test_built_in_data_is_given_alone() -> None:
    assert data_entries("stdlib") == (DataEntry("stdlib", "stdlib"),)
    assert [e.weight for e in data_entries(("a.txt:3", "b.txt"))] == [3.0, 1.0]
    with pytest.raises(DataRefused) as refused:
        data_entries(("a.txt", "synthetic"))
    assert str(refused.value.said(cli=False)) == (
        "data synthetic is built-in data and takes no other --data beside it; give it alone, or only paths"
    )


def test_a_path_is_the_kind_of_source_it_is(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("x")
    (tmp_path / "c.jsonl").write_text("{}")
    (tmp_path / "t.parquet").write_bytes(b"")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "state.json").write_text("{}")
    (saved / "dataset_info.json").write_text("{}")
    kinds = {name: Source.of(str(tmp_path / name)).kind for name in ("notes.md", "c.jsonl", "saved")}
    assert kinds == {"notes.md": SourceKind.TEXT, "c.jsonl": SourceKind.JSONL, "saved": SourceKind.HF_SAVED}
    parquet = Source.of(str(tmp_path / "t.parquet"))
    assert (parquet.kind, parquet.builder, parquet.pattern) == (
        SourceKind.HF_FILES,
        "parquet",
        str(tmp_path / "t.parquet"),
    )
    assert Source.of("hf:csv:data/*.csv") == Source("hf:csv:data/*.csv", SourceKind.HF_FILES, "csv", "data/*.csv")
    assert Source.of(str(tmp_path)).kind is SourceKind.FOLDER


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("hf:xml:data/*.xml", "hf:BUILDER:FILES takes a builder of json, text, parquet, csv and the files, e.g. "
         "hf:parquet:data/*.parquet"),
        ("hf:json", "hf:BUILDER:FILES takes a builder of json, text, parquet, csv and the files, e.g. "
         "hf:parquet:data/*.parquet"),
        ("/no/such/corpus.txt", "no such file or folder"),
    ],
)  # fmt: skip
def test_a_path_that_is_no_source_is_refused_naming_it(path: str, why: str) -> None:
    with pytest.raises(DataRefused) as refused:
        Source.of(path)
    assert str(refused.value) == f"{path}: {why}"


def test_a_saved_dataset_dict_is_refused_naming_its_splits(tmp_path: Path) -> None:
    (tmp_path / "dataset_dict.json").write_text("{}")
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    with pytest.raises(DataRefused) as refused:
        Source.of(str(tmp_path))
    assert str(refused.value) == (
        f"{tmp_path}: a saved DatasetDict; give one of its splits' folders ({tmp_path / 'test'}, "
        f"{tmp_path / 'train'}); {tmp_path / 'test'} can be the evaluation corpus (--eval-data; eval_data in Python)"
    )


def test_a_folder_reads_its_text_files_or_every_file_but_hidden_ones_in_path_order(tmp_path: Path) -> None:
    for name in ("b/z.txt", "a.jsonl", "code.py", ".git/HEAD", "b/__pycache__/m.pyc", "c.txt.bak", ".ipynb_x/a.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("text")
    folder = Source.of(str(tmp_path))
    assert [p.relative_to(tmp_path).as_posix() for p in folder.files(BLANK)] == ["a.jsonl", "b/z.txt"]
    every = [p.relative_to(tmp_path).as_posix() for p in folder.files(BY_FILE)]
    assert every == ["a.jsonl", "b/z.txt", "c.txt.bak", "code.py"]
    assert folder.reads_field  # it has a .jsonl file: --data-field says which field is its documents


def test_a_folder_without_a_file_to_read_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("x")
    kinds = r"\.txt, \.jsonl, \.ndjson, \.parquet, \.csv, \.tsv"
    with pytest.raises(DataRefused, match=rf": a folder without a file of {kinds} in it$"):
        Source.of(str(tmp_path)).files(BLANK)
    records = tmp_path / "records"
    records.mkdir()
    (records / "part-0.json").write_text("[]")
    with pytest.raises(DataRefused) as refused:
        Source.of(str(records)).files(BLANK)
    assert str(refused.value.said(cli=True)) == (
        f"--data {records}: a folder without a file of .txt, .jsonl, .ndjson, .parquet, .csv, .tsv in it; for its "
        f".json files give hf:json:{records}/**/*.json"
    )
    with pytest.raises(DataRefused, match=r"^hf:json:/none/\*\.jsonl: no file matches /none/\*\.jsonl$"):
        Source.of("hf:json:/none/*.jsonl").files(BLANK)


def test_a_folders_documents_are_its_files_documents_in_order(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("three\n\nfour")
    (tmp_path / "a.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    assert list(Source.of(str(tmp_path)).texts(BLANK, "text")) == ["one", "two", "three", "four"]
    assert list(Source.of(str(tmp_path / "b.txt")).texts(BY_FILE, "text")) == ["three\n\nfour"]


def _corpus_in_every_form(folder: Path) -> dict[str, Path]:
    """One corpus of three documents written as each form of file ``--data`` reads it from, by name."""
    documents = ["one\nline two", "three", "four é"]
    records = [{"text": d, "n": i} for i, d in enumerate(documents)]
    lines = "".join(json.dumps(r) + "\n" for r in records)
    plain = "\n\n".join(documents)
    forms = {
        "c.jsonl": lines,
        "c.ndjson": lines,
        "lines.json": lines,
        "array.json": json.dumps(records, indent=2),
        "c.txt": plain,
        "c.csv": "text,n\n" + "".join(f'"{d}",{i}\n' for i, d in enumerate(documents)),
        "c.tsv": "n\ttext\n" + "".join(f'{i}\t"{d}"\n' for i, d in enumerate(documents)),
    }
    written = {}
    for name, text in forms.items():
        written[name] = folder / name
        written[name].write_text(text, encoding="utf-8")
    for suffix, module in ((".gz", gzip), (".bz2", bz2), (".xz", lzma)):
        for name in ("c.jsonl", "array.json", "c.txt", "c.csv", "c.tsv"):
            with module.open(folder / (name + suffix), "wt", encoding="utf-8") as packed:
                packed.write(forms[name])
            written[name + suffix] = folder / (name + suffix)
    return written


def test_every_form_of_a_file_gives_its_documents_and_its_name_says_its_form(tmp_path: Path) -> None:
    forms = _corpus_in_every_form(tmp_path)
    for name, path in forms.items():
        source = Source.of(str(path))
        assert list(source.texts(BLANK, "text")) == ["one\nline two", "three", "four é"], name
        by_suffix = {".csv": SourceKind.HF_FILES, ".tsv": SourceKind.HF_FILES, ".txt": SourceKind.TEXT}
        kind = by_suffix.get(Path(name).suffixes[0], SourceKind.JSONL)
        assert source.kind is kind, name
        assert source.reads_field is (kind is not SourceKind.TEXT), name


def test_a_compressed_files_bytes_on_disk_are_what_is_counted_and_digested(tmp_path: Path) -> None:
    path = _corpus_in_every_form(tmp_path)["c.jsonl.gz"]
    counted: list[int] = []
    digest = hashlib.sha256()
    blocks = list(read_blocks(path, on_bytes=counted.append, digest=digest))
    assert "".join(blocks) == gzip.decompress(path.read_bytes()).decode()
    assert sum(counted) == path.stat().st_size
    assert digest.hexdigest() == hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_folder_reads_its_compressed_text_files_and_not_its_json_descriptions(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as packed:
        packed.write('{"text": "one"}\n')
    with lzma.open(tmp_path / "b.txt.xz", "wt") as packed:
        packed.write("two\n\nthree")
    (tmp_path / "dataset_info.json").write_text('{"text": "not a document"}')
    (tmp_path / "c.md.gz").write_bytes(gzip.compress(b"not a text file's name"))
    folder = Source.of(str(tmp_path))
    assert [p.name for p in folder.files(BLANK)] == ["a.jsonl.gz", "b.txt.xz"]
    assert list(folder.texts(BLANK, "text")) == ["one", "two", "three"]
    assert folder.reads_field


#: A file ``--data`` cannot read, by name: its bytes, and why it is refused (gzip's with no time in them, so that
#: every test worker collects the same cases).
UNREAD: list[tuple[str, bytes, str]] = [
    ("c.jsonl.zst", b"\x28\xb5\x2f\xfd", "zstd, which hintpipe does not read (it reads .gz, .bz2, .xz): decompress it "
     "(zstd -d), or give it as a .gz file"),
    ("c.zip", b"PK", "a zip archive, which hintpipe does not read (it reads .gz, .bz2, .xz): unpack it (unzip) and "
     "give its files or their folder"),
    ("c.tar.gz", gzip.compress(b"a tar archive's bytes", mtime=0), "a tar archive, which hintpipe does not read (it "
     "reads .gz, .bz2, .xz): unpack it (tar -xf) and give its files or their folder"),
    ("c.jsonl.gz", b"plain", "does not decompress as its name says (Not a gzipped file (b'pl'))"),
    ("c.txt.xz", b"plain", "does not decompress as its name says (Input format not supported by decoder)"),
    ("c.txt.bz2", b"plain", "does not decompress as its name says (Invalid data stream)"),
    ("cut.txt.gz", gzip.compress(b"abc" * 100, mtime=0)[:-12], "does not decompress as its name says (Compressed "
     "file ended before the end-of-stream marker was reached)"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "content", "why"), UNREAD, ids=[name for name, _, _ in UNREAD])
def test_a_file_its_compression_does_not_read_is_refused_saying_what_to_do(
    tmp_path: Path, name: str, content: bytes, why: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataRefused) as refused:
        list(Source.of(str(path)).texts(BLANK, "text"))
    assert str(refused.value.said(cli=True)) == f"--data {path}: {why}"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[{"text": "a"}, 3]', "element 1: a JSON number, not an object"),
        (
            '[{"text": "a"}, {"body": "b"}]',
            "element 1: no field 'text' (its fields: 'body'); name one with --data-field",
        ),
        ('[{"text": "a"},\n {"text": 2}]', "element 1: field 'text' is a JSON number, not a string"),
        ('[{"text": "a"},\n {"text": "b"}', "not JSON (Expecting ',' delimiter, line 2, column 15)"),
        ('{"text": "a"}\n[1]\n', "line 2: a JSON array, not an object"),
        (
            '{\n  "data": [{"text": "a"}]\n}',
            "line 1: not JSON (Expecting property name enclosed in double quotes, "
            "column 2); a JSON file's records are one object per line, or one array of objects",
        ),
        ('{"text": "a"}\n{"text": \n', "line 2: not JSON (Expecting value, column 10)"),
    ],
)
def test_a_json_files_bad_record_is_refused_naming_where_it_is(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(text)
    with pytest.raises(DataRefused) as refused:
        list(Source.of(str(path)).texts(BLANK, "text"))
    assert str(refused.value.said(cli=True)) == f"--data {path}, {why}" if why[0] in "el" else f"--data {path}: {why}"


def test_a_refusal_pickles_with_its_option_and_its_fix() -> None:
    refused = DataRefused("data", "c.jsonl, line 2: no field 'text' (its fields: 'body')", fix=FIELD_FIX)
    again = pickle.loads(pickle.dumps(refused))
    assert (type(again), again.option, again.fix, str(again)) == (DataRefused, "data", FIELD_FIX, str(refused))
    assert str(again.said(cli=True)) == f"--data {refused}; name one with --data-field"
