"""``hintpipe data prepare``: tokenize sources once into memory-mapped shards that ``train --data DIR`` reads.

A run on raw files prepares them itself on first use (into a cache folder, see :mod:`hintpipe.data.cache`);
this command does it ahead, into a folder the user names: on a machine with the sources, before a run on
many machines; for a corpus whose preparation should not be timed as part of a run; or to copy the shards
where the sources are not.

This module is torch-free.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from hintpipe.cli.common import add_option, bytes_progress, print_json, stdout
from hintpipe.data.manifest import Manifest
from hintpipe.data.prepare import prepare
from hintpipe.data.refusal import DataRefused

HELP = "prepare data once: tokenize sources into memory-mapped shards that `hintpipe train --data DIR` reads"
PREPARE_HELP = (
    "tokenize SOURCE... (text, JSONL, folders, Hugging Face datasets) once into token shards, a document index "
    "and a manifest in --out DIR"
)


def register(commands: Any) -> None:
    parser = commands.add_parser("data", help=HELP, description=HELP)
    actions = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    prep = actions.add_parser("prepare", help=PREPARE_HELP, description=PREPARE_HELP)
    prep.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="a text file, a .jsonl or .json file (either compressed: .gz, .bz2, .xz), a folder of them, a folder "
        "a datasets.Dataset was saved to, or hf:BUILDER:FILES (json, text, parquet, csv): one corpus, in the "
        "order given",
    )
    prep.add_argument("--out", required=True, metavar="DIR", help="the prepared folder to write (a new one)")
    for name in ("tokenizer", "data_split", "data_field"):
        add_option(prep, name)
    prep.add_argument("--replace", action="store_true", help="replace --out if it is a prepared folder already")
    prep.add_argument("--json", action="store_true", help="print one JSON object")
    prep.set_defaults(run=run_prepare)


def run_prepare(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    try:
        with bytes_progress("preparing", enabled=not args.json) as progress:
            manifest = prepare(
                args.sources,
                args.out,
                tokenizer=args.tokenizer,
                split=args.data_split,
                field=args.data_field,
                replace=args.replace,
                progress=progress,
            )
    except DataRefused as exc:
        raise exc.said(cli=True) from None
    seconds = time.perf_counter() - started
    if args.json:
        print_json(summary(manifest, args.out, seconds))
        return 0
    shards = f"{len(manifest.shards)} shard{'s' if len(manifest.shards) > 1 else ''}"
    rate = manifest.tokens / max(seconds, 1e-9)
    short = f"; {manifest.short_left_out:,} documents of under 2 tokens left out" if manifest.short_left_out else ""
    stdout.print(
        f"prepared {args.out}: {manifest.documents:,} documents, {manifest.tokens:,} tokens ({manifest.dtype}, "
        f"{shards}) in {seconds:.1f} s ({rate:,.0f} tokens/s){short}",
        highlight=False,
        markup=False,
    )
    stdout.print(f"train from it: hintpipe train --data {args.out} ...", highlight=False, markup=False)
    return 0


def summary(manifest: Manifest, out: str, seconds: float) -> dict[str, Any]:
    """``--json``'s object: the counts, the time and the sources."""
    return {
        "out": out,
        "documents": manifest.documents,
        "tokens": manifest.tokens,
        "short_left_out": manifest.short_left_out,
        "vocab": manifest.vocab,
        "dtype": manifest.dtype,
        "shards": len(manifest.shards),
        "prepare_time_s": seconds,
        "tokens_per_s": manifest.tokens / max(seconds, 1e-9),
        "sources": [
            {"given": s.given, "kind": s.kind, "files": len(s.files), "documents": s.documents, "tokens": s.tokens}
            for s in manifest.sources
        ],
    }
