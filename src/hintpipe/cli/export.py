"""``hintpipe export``: a checkpoint out as a model others load (a Hugging Face one: ``from_pretrained``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hintpipe.cli.common import print_json, stdout
from hintpipe.modes import WeightsDtype

HELP = "write a checkpoint's model to a folder: save_pretrained for Hugging Face models, safetensors for built-in ones"
DESCRIPTION = (
    f"{HELP}. The checkpoint's manifest says which model it holds (hintpipe train records it); the model is "
    "rebuilt from it, the checkpoint's tensors loaded with strict=True, and written: a Hugging Face model with "
    "save_pretrained (transformers' from_pretrained(OUT_DIR) loads it), a built-in one as model.safetensors and "
    "hintpipe_model.json (its ModelConfig; hintpipe.apps.models.whole_model builds it)."
)


def register(commands: Any) -> None:
    parser = commands.add_parser("export", help=HELP, description=DESCRIPTION)
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="a --checkpoint-dir folder (its newest verified checkpoint) or one of its step-N folders",
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write, new or empty")
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty OUT_DIR (an earlier export's files there are replaced, others left)",
    )
    parser.add_argument(
        "--dtype",
        choices=[dtype.value for dtype in WeightsDtype],
        default=WeightsDtype.FP32.value,
        help="the weights' dtype in the files: fp32 (as trained; the default), or bf16 or fp16 (half the size; a "
        "Hugging Face model's config.json records it)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from hintpipe.apps.export import export_checkpoint  # here, not above: ``hintpipe simulate`` runs without torch
    from hintpipe.runtime.errors import CheckpointError

    try:
        done = export_checkpoint(args.checkpoint, args.out_dir, force=args.force, dtype=args.dtype)
    except CheckpointError as exc:  # damaged, unsafe, or no usable checkpoint: the user's input, said in one line
        raise ValueError(str(exc)) from None
    if args.json:
        said = {"out_dir": str(done.out_dir), "step": done.step, "architecture": done.architecture}
        said["dtype"] = done.dtype.value
        print_json(said | {"files": list(done.files), "notes": list(done.notes)})
        return 0
    for note in done.notes:
        print(f"hintpipe export: {note}", file=sys.stderr)
    stdout.print(f"{done.checkpoint} (step {done.step}, {done.architecture}, {done.dtype}) exported to {done.out_dir}:")
    stdout.print(f"  {', '.join(done.files)}")
    if "config.json" in done.files:
        stdout.print(f"load it with transformers.{done.architecture}.from_pretrained({str(done.out_dir)!r})")
        if "tokenizer_config.json" in done.files or "tokenizer.json" in done.files:
            stdout.print(f"and its tokenizer with transformers.AutoTokenizer.from_pretrained({str(done.out_dir)!r})")
    else:
        stdout.print("load it with hintpipe.apps.models.whole_model and safetensors (see hintpipe.apps.export)")
    return 0
