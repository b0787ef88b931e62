"""Tokenize once, then train with flat memory: a generated text corpus of several GB prepared by
``hintpipe data prepare`` (its time and tokens/s), then 2 steps on 2 ranks from it, each process's peak RSS
against the same run on a 10 MB corpus.

The corpus is plain text, documents separated by blank lines, drawn from a pool of paragraphs of random words
(lengths from a few words to a few thousand), so its documents have the heavy-tailed lengths of real text.
Every command runs as ``hintpipe`` does for a user (``python -m hintpipe``), in a process of its own; a sampler
reads every process of the run's tree (the launcher, the fork server, the ranks) from ``/proc`` every 50 ms
and keeps each one's ``VmHWM`` (its peak resident memory so far), so a rank's peak is read before it exits.

    python benchmarks/data-prepare/data_prepare.py --gigabytes 2 --work /tmp/hintpipe-data-prepare

The corpora are prepared with ``bytes`` (the tokenizer costs nothing: what preparing itself costs); a third,
of 250 MB, with a byte-level BPE of 8,192 ids trained on the small corpus (``tokenizers``, saved as a user's
tokenizer folder: what a run's preparation costs when the tokenizer is a real one).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

WORDS = 5000
POOL = 20_000
TRAIN = [
    "train", "--ranks", "2", "--microbatches", "4", "--microbatch-size", "4", "--steps", "2", "--layers", "2",
    "--hidden", "64", "--heads", "2", "--max-seq-len", "256", "--timeout", "300", "--json",
]  # fmt: skip


def generate(path: Path, size: int, seed: int) -> int:
    """Write about ``size`` bytes of documents separated by blank lines; returns the documents written."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"etaoinshrdlucmfwypvbgkjqxz", dtype=np.uint8)
    vocabulary = ["".join(chr(c) for c in rng.choice(letters, size=int(n))) for n in rng.integers(1, 11, WORDS)]
    words = np.array(vocabulary, dtype=object)
    lengths = np.minimum(rng.lognormal(4.5, 1.0, size=POOL).astype(int) + 3, 4000)  # words per paragraph
    pool = [_lines(words[rng.integers(0, WORDS, size=int(n))]) for n in lengths]
    written = documents = 0
    with open(path, "w", encoding="utf-8") as handle:
        while written < size:
            chunk = "\n\n".join(pool[i] for i in rng.integers(0, POOL, size=512)) + "\n\n"
            handle.write(chunk)
            written += len(chunk)
            documents += 512
    return documents


def _lines(words: Any) -> str:
    """Words as lines of 12 words (about 70 characters), as prose is written."""
    return "\n".join(" ".join(words[i : i + 12]) for i in range(0, len(words), 12))


class PeakSampler:
    """Every process under ``root`` (itself included), its role and its ``VmHWM`` in bytes: ``root`` is the
    launcher; multiprocessing's fork server is its child, and the ranks are the fork server's children (forked,
    they share its command line, so a rank is known by its parent)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peaks: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> dict[int, tuple[str, int]]:
        self._stop.set()
        self._thread.join()
        return self.peaks

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid, parent in self._tree():
                peak = _status(pid, "VmHWM")
                if peak is not None:
                    role = self.peaks.get(pid, (self._role(pid, parent), 0))[0]
                    self.peaks[pid] = (role, max(peak, self.peaks.get(pid, ("", 0))[1]))
            time.sleep(0.05)

    def _role(self, pid: int, parent: int) -> str:
        if pid == self.root:
            return "launcher"
        text = _command(pid)
        if "resource_tracker" in text:
            return "resource tracker"
        if "forkserver" in text:
            return "rank" if "forkserver" in _command(parent) else "fork server"
        return "rank"

    def _tree(self) -> list[tuple[int, int]]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        parent = int(stat.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry))
        found, todo = [], [(self.root, 0)]
        while todo:
            pid, parent = todo.pop()
            found.append((pid, parent))
            todo += [(child, pid) for child in children.get(pid, [])]
        return found


def _status(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def run(argv: list[str], env: dict[str, str]) -> tuple[float, dict[int, tuple[str, int]], str]:
    """Run ``python -m hintpipe ARGV``: (seconds, peaks by process, stdout)."""
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "hintpipe", *argv], env=env, stdout=subprocess.PIPE, text=True)
    sampler = PeakSampler(process.pid)
    out, _ = process.communicate()
    seconds = time.perf_counter() - started
    peaks = sampler.stop()
    if process.returncode:
        raise SystemExit(f"hintpipe {' '.join(argv)} failed with status {process.returncode}")
    return seconds, peaks, out


def bpe_tokenizer(corpus: Path, folder: Path, vocab: int) -> None:
    """A byte-level BPE of ``vocab`` ids trained on ``corpus``, saved as ``save_pretrained`` saves one."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train([str(corpus)], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe)  # type: ignore[no-untyped-call]
    fast.save_pretrained(str(folder))


def measure(name: str, corpus: Path, tokenizer: str, work: Path, env: dict[str, str]) -> dict[str, Any]:
    """Prepare ``corpus`` with ``tokenizer``, then train 2 steps on 2 ranks from it."""
    prepared = work / f"{name}-prepared"
    shutil.rmtree(prepared, ignore_errors=True)
    seconds, peaks, out = run(
        ["data", "prepare", str(corpus), "--tokenizer", tokenizer, "--out", str(prepared), "--json"], env
    )
    said = json.loads(out)
    train_seconds, train_peaks, _ = run([*TRAIN, "--data", str(prepared)], env)
    shutil.rmtree(prepared, ignore_errors=True)
    return {
        "corpus_bytes": corpus.stat().st_size,
        "tokenizer": "bytes" if tokenizer == "bytes" else "bpe",
        "documents": said["documents"],
        "tokens": said["tokens"],
        "dtype": said["dtype"],
        "shards": said["shards"],
        "prepare_time_s": seconds,
        "prepare_tokens_per_s": said["tokens"] / seconds,
        "prepare_peak_rss_bytes": max(peak for _, peak in peaks.values()),
        "train_time_s": train_seconds,
        "train_peak_rss_bytes": sorted(([role, peak] for role, peak in train_peaks.values()), key=str),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=2.0, help="the large corpus's size (default 2)")
    parser.add_argument("--small-megabytes", type=float, default=10.0, help="the small corpus's size (default 10)")
    parser.add_argument("--bpe-vocab", type=int, default=8192, help="the BPE's vocabulary (0: no BPE run)")
    parser.add_argument(
        "--bpe-megabytes", type=float, default=250.0, help="the corpus the BPE prepares (default 250: BPE is slow)"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/hintpipe-data-prepare"), help="scratch folder")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, HINTPIPE_CACHE=str(args.work / "cache"))
    corpora = {"small": args.work / "small.txt", "large": args.work / "large.txt"}
    sizes = {"small": int(args.small_megabytes * 1e6), "large": int(args.gigabytes * 1e9)}
    if args.bpe_vocab:
        corpora["medium"] = args.work / "medium.txt"
        sizes["medium"] = int(args.bpe_megabytes * 1e6)
    generated = {}
    for name, corpus in corpora.items():
        started = time.perf_counter()
        generate(corpus, sizes[name], seed=list(corpora).index(name))
        generated[name] = time.perf_counter() - started
    runs = [("small", "bytes"), ("large", "bytes")]
    if args.bpe_vocab:
        bpe_tokenizer(corpora["small"], args.work / "bpe", args.bpe_vocab)
        runs.append(("medium", str(args.work / "bpe")))
    results: dict[str, Any] = {"generate_time_s": generated}
    for name, tokenizer in runs:
        label = f"{name}, {'bytes' if tokenizer == 'bytes' else 'bpe'}"
        results[label] = measure(name, corpora[name], tokenizer, args.work, env)
        print(json.dumps({label: results[label]}), flush=True)
    print(json.dumps(results, indent=2))
    for label, result in results.items():
        if label == "generate_time_s":
            continue
        peaks = ", ".join(f"{role} {peak / 2**20:.0f} MiB" for role, peak in result["train_peak_rss_bytes"])
        print(
            f"{label}: {result['corpus_bytes'] / 1e9:.3f} GB, {result['tokens']:,} tokens ({result['dtype']}) "
            f"prepared in {result['prepare_time_s']:.1f} s ({result['prepare_tokens_per_s'] / 1e6:.2f} M tokens/s, "
            f"peak RSS {result['prepare_peak_rss_bytes'] / 2**20:.0f} MiB); 2 steps on 2 ranks in "
            f"{result['train_time_s']:.1f} s, peak RSS: {peaks}"
        )
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
