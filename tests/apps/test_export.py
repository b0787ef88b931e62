"""A checkpoint out as a model others load: the description a manifest keeps, and ``hintpipe export``.

The unit tests write manifests by hand (no tensors, no ranks): a description
goes through a manifest and back, a manifest without one still reads, and each
refusal is one exact line. The end-to-end tests train on 2 spawned ranks (one
run each): ``hintpipe train --model hf-gpt2`` on a text file, the whole run from one
config file, with TensorBoard (its scalars read back with tensorboard's own reader),
exported and loaded by ``transformers`` alone, its parameters equal to ``load_merged``'s bit for bit
and its loss on the run's held-out batch equal to the pipeline's (rel 1e-5:
float32, the captured graph's kernels against the eager model's, in eval mode
both); a gpt-mini exported and rebuilt with hintpipe's builder, its state
equal to the run's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers

from conftest import small_run
from hintpipe import hf_description
from hintpipe.apps.export import ExportError, export_checkpoint
from hintpipe.apps.model_description import describe_model, rebuild_model
from hintpipe.apps.models import ModelConfig, whole_model
from hintpipe.apps.training import HELD_OUT_STEP, train
from hintpipe.cli import main
from hintpipe.planner.plan_file import read_plan_file
from hintpipe.runtime.checkpoint.checkpointer import Checkpointer
from hintpipe.runtime.checkpoint.description import checked_description
from hintpipe.runtime.checkpoint.manifest import MANIFEST, MANIFEST_DIGEST, Manifest, RunIdentity
from hintpipe.runtime.checkpoint.merged import load_merged

GPT_MINI = {"kind": "hintpipe", "hintpipe_model": dataclasses.asdict(ModelConfig("gpt-mini", layers=1, hidden=8))}


def _identity(model: dict[str, Any] | None = None) -> RunIdentity:
    return RunIdentity(tensors={"0.w": [2, 3]}, stage_ranks=[0, 1], hint="1f1b", versions={}, run="r1", model=model)


def _fake_checkpoint(root: Path, model: dict[str, Any] | None, step: int = 3) -> Path:
    """A checkpoint folder whose one step's manifest verifies (it vouches for no file)."""
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    Manifest(step, _identity(model), {}).write(folder)
    return folder


def _one_line(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# -- the description in a manifest -------------------------------------------------------------------------------


def test_a_description_goes_through_a_manifest_and_back_and_is_never_compared(tmp_path: Path) -> None:
    described = describe_model(ModelConfig("hf-gpt2", layers=2, hidden=32))
    folder = _fake_checkpoint(tmp_path, described)
    read = Manifest.read(folder).identity
    assert read.model == described and read == _identity(described)
    assert _identity().differences(read) == [] and read.differences(_identity()) == []  # resumable either way


def test_a_manifest_without_a_description_reads_as_before(tmp_path: Path) -> None:
    # As hintpipe 0.6 wrote it: format 2, no "model" key in the identity.
    folder = tmp_path / "step-00000001"
    folder.mkdir()
    identity = {k: v for k, v in _identity().to_json().items() if k != "model"}
    text = json.dumps({"format": 2, "step": 1, "identity": identity, "files": {}}, indent=1, sort_keys=True)
    (folder / MANIFEST).write_text(text)
    (folder / MANIFEST_DIGEST).write_text(hashlib.sha256(text.encode()).hexdigest())
    assert Manifest.read(folder).identity == _identity()
    assert Manifest.read(folder).identity.model is None


def test_a_built_in_hugging_face_model_is_described_by_its_transformers_config() -> None:
    # The user's report: the config that loads a CLI checkpoint was only in hintpipe's code.
    config = ModelConfig("hf-gpt2", layers=2, hidden=32, max_seq_len=17)
    described = describe_model(config)
    assert (described["kind"], described["architecture"]) == ("hf", "GPT2LMHeadModel")
    assert described["hintpipe_model"] == dataclasses.asdict(config)
    hf = described["config"]
    sizes = {"model_type": "gpt2", "vocab_size": 128, "n_positions": 17, "n_layer": 2, "n_embd": 32}
    plain = {"bos_token_id": 0, "eos_token_id": 0, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    assert {k: hf[k] for k in {**sizes, **plain}} == {**sizes, **plain}
    assert json.loads(json.dumps(described)) == described
    built_in = {"kind": "hintpipe", "hintpipe_model": dataclasses.asdict(ModelConfig())}
    assert describe_model(ModelConfig("gpt-mini")) == built_in


def test_a_hugging_face_model_of_ones_own_is_rebuilt_from_its_description() -> None:
    config = transformers.LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=40, max_position_embeddings=32, tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    described = checked_description(hf_description(model))  # what a Checkpointer records
    rebuilt = rebuild_model(described)
    assert type(rebuilt) is transformers.LlamaForCausalLM and rebuilt.config.to_dict() == model.config.to_dict()
    rebuilt.load_state_dict(model.state_dict(), strict=True)
    assert rebuilt.lm_head.weight is rebuilt.model.embed_tokens.weight  # tied, as the original


def test_a_description_that_is_not_plain_values_is_refused_when_the_checkpointer_is_made(tmp_path: Path) -> None:
    stages = {0: torch.nn.Linear(1, 1)}
    with pytest.raises(ValueError) as refused:
        Checkpointer(tmp_path, stages, None, model_description={"kind": "x", "dtype": torch.float32})
    assert str(refused.value) == (
        "model_description must hold plain JSON values (dicts, lists, strings, numbers): Object of type dtype is not "
        "JSON serializable"
    )
    with pytest.raises(ValueError) as refused:
        Checkpointer(tmp_path, stages, None, model_description={"architecture": "GPT2LMHeadModel"})
    assert str(refused.value) == (
        "model_description is not a model's description: it has no 'kind' (a string: 'hf' or 'hintpipe'), it has None"
    )
    with pytest.raises(TypeError) as wrong:
        hf_description(torch.nn.Linear(1, 1))
    assert str(wrong.value) == "hf_description takes a transformers PreTrainedModel, not a Linear"


def test_a_plan_file_of_a_hugging_face_model_keeps_its_transformers_config(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.plan"
    planning = ["plan", "--model", "hf-gpt2", "--layers", "2", "--hidden", "32", "--ranks", "2", "--microbatches", "2"]
    planning += ["--max-seq-len", "17"]  # the model's positions (the profile's length is --seq-len's)
    assert main([*planning, "--seq-len", "16", "--repeats", "1", "--save", str(path), "--json"]) == 0
    model = read_plan_file(path)["model"]
    assert model["config"]["max_seq_len"] == 17  # what `train --plan` reads
    assert model["description"] == describe_model(ModelConfig(**model["config"]))
    assert model["description"]["config"]["n_positions"] == 17


# -- refusals ----------------------------------------------------------------------------------------------------


def test_what_is_not_a_checkpoint_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    said = _one_line(capsys, "export", str(tmp_path / "nowhere"), str(out))
    assert said == (
        f"hintpipe export: error: {tmp_path / 'nowhere'} does not exist; give a --checkpoint-dir folder or one of its "
        "step-N folders"
    )
    (tmp_path / "empty").mkdir()
    assert _one_line(capsys, "export", str(tmp_path / "empty"), str(out)) == (
        f"hintpipe export: error: {tmp_path / 'empty'} is not a hintpipe checkpoint (no manifest.json in it, no step-N "
        "folder under it); give a --checkpoint-dir folder or one of its step-N folders"
    )
    assert not out.exists()


def test_a_checkpoint_without_a_description_is_refused_saying_how_to_export_it_by_hand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, out = tmp_path / "ck", tmp_path / "out"
    folder = _fake_checkpoint(root, None)
    assert _one_line(capsys, "export", str(root), str(out)) == (
        f"hintpipe export: error: {folder} does not say which model it holds (written by hintpipe before 0.7, or by "
        "a Checkpointer given no model_description=); export it by hand: build the model, then "
        f"model.load_state_dict(hintpipe.load_merged('{root}'), strict=True) and model.save_pretrained('{out}')"
    )
    assert not out.exists()


def test_a_non_empty_out_dir_is_refused_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _fake_checkpoint(tmp_path / "ck", GPT_MINI)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert _one_line(capsys, "export", str(folder), str(out)) == (
        f"hintpipe export: error: {out} is not empty; export into a new or empty folder, or write over it with --force"
    )
    assert _one_line(capsys, "export", str(folder), str(folder.parent)) == (
        f"hintpipe export: error: {folder.parent} is the checkpoint's own folder; export into another"
    )
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "out"]  # no staging folder left


def test_a_description_this_hintpipe_cannot_build_is_refused(tmp_path: Path) -> None:
    weird = _fake_checkpoint(tmp_path / "weird", {"kind": "onnx"})
    with pytest.raises(ExportError) as refused:
        export_checkpoint(weird, tmp_path / "out")
    assert str(refused.value) == (
        f"cannot export {weird}: its model is of kind 'onnx', which this hintpipe does not build (it builds 'hf' "
        "and 'hintpipe')"
    )
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16}
    forged = _fake_checkpoint(tmp_path / "forged", {"kind": "hf", "architecture": "logging", "config": config})
    with pytest.raises(ExportError) as refused:
        export_checkpoint(forged, tmp_path / "out")
    assert str(refused.value) == (
        f"cannot export {forged}: 'logging' is not a model class of transformers {transformers.__version__}"
    )
    assert not (tmp_path / "out").exists()


KERNEL = "kernels-community/flash-attn2"


def _no_network(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every host name looked up from here on (each refused): transformers looks up huggingface.co to fetch a
    kernel."""
    looked_up: list[object] = []

    def refuse(host: object, *args: object, **kwargs: object) -> None:
        looked_up.append(host)
        raise socket.gaierror("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return looked_up


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("attn_implementation", KERNEL, "not one of transformers' own (eager, sdpa, flex_attention)"),
        ("_attn_implementation", "flash_attention_2", "not one of transformers' own (eager, sdpa, flex_attention)"),
        (
            "experts_implementation",
            "kernels-community/sonic",
            "not one of transformers' own (eager, batched_mm, grouped_mm)",
        ),
    ],
)
def test_an_export_builds_no_kernel_a_description_names_and_fetches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, key: str, value: str, said: str
) -> None:
    # Before: transformers looked up huggingface.co to fetch the kernel (here refused, so it failed saying it
    # "could not verify publisher trust status").
    looked_up = _no_network(monkeypatch)
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16, key: value}
    step = _fake_checkpoint(tmp_path / "ck", {"kind": "hf", "architecture": "GPT2LMHeadModel", "config": config})
    line = _one_line(capsys, "export", str(step), str(tmp_path / "out"))
    assert line == (
        f"hintpipe export: error: cannot export {step}: its config's {key} is {value!r}, {said}: hintpipe builds "
        "a model with transformers' own code only, no kernel from the Hub; use one of those or leave it out"
    )
    assert looked_up == []
    assert not (tmp_path / "out").exists()


def test_a_description_asking_for_code_in_a_sub_config_is_refused(tmp_path: Path) -> None:
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16}
    nested = {**config, "text_config": {"auto_map": {"AutoModel": "mine.Model"}}}
    step = _fake_checkpoint(tmp_path / "ck", {"kind": "hf", "architecture": "GPT2LMHeadModel", "config": nested})
    with pytest.raises(ExportError) as refused:
        export_checkpoint(step, tmp_path / "out")
    assert str(refused.value) == (
        f"cannot export {step}: its config's text_config.auto_map is {{'AutoModel': 'mine.Model'}}: hintpipe builds "
        "a model with transformers' own code only (no code from a folder or the Hub, no quantizer); remove it"
    )


def test_transformers_own_attention_is_built_as_described() -> None:
    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "vocab_size": 16}
    for implementation in ("eager", "sdpa"):
        described = {
            "kind": "hf",
            "architecture": "GPT2LMHeadModel",
            "config": config | {"attn_implementation": implementation},
        }
        model = rebuild_model(described)
        assert isinstance(model, transformers.GPT2LMHeadModel)
        assert model.config._attn_implementation == implementation


def test_a_model_folder_whose_config_names_a_kernel_is_refused_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    looked_up = _no_network(monkeypatch)
    folder = tmp_path / "gpt2"
    folder.mkdir()
    settings = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=64, n_positions=128).to_dict()
    (folder / "config.json").write_text(json.dumps(settings | {"attn_implementation": KERNEL}))
    line = _one_line(capsys, "train", "--model", str(folder), "--init", "random", "--ranks", "2", "--microbatches", "2")
    assert line == (
        f"hintpipe train: error: --model {folder}: its config.json's attn_implementation is {KERNEL!r}, not one of "
        "transformers' own (eager, sdpa, flex_attention): hintpipe builds a model with transformers' own code only, "
        "no kernel from the Hub; use one of those or leave it out"
    )
    assert looked_up == []


# -- end to end --------------------------------------------------------------------------------------------------


#: The whole run, from a config file: keys are the flags' names, in their sections.
RUN_TOML = """
[model]
model = "hf-gpt2"
layers = 2
hidden = 32

[data]
data = "{data}"

[optimizer]
clip_grad_norm = 1.0

[lr_schedule]
lr_schedule = "warmup-cosine"
warmup_steps = 1

[training]
microbatches = 2
microbatch_size = 2
steps = 3
seed = 0

[parallelism]
ranks = 2

[checkpoint]
checkpoint_dir = "{checkpoints}"

[metrics]
eval_every = 2
tensorboard = "{tensorboard}"
"""


def _text_file(path: Path) -> Path:
    """40 paragraphs of made-up prose: 38 to train on, 2 held out (every 20th)."""
    words = [
        "the",
        "pipeline",
        "runs",
        "ahead",
        "while",
        "a",
        "stage",
        "waits",
        "for",
        "its",
        "neighbour",
        "and",
        "memory",
        "stays",
        "in",
        "budget",
    ]
    paragraphs = [" ".join(words[(i + j) % len(words)] for j in range(8 + i % 5)) for i in range(40)]
    path.write_text("\n\n".join(paragraphs) + "\n", encoding="utf-8")
    return path


def test_gpt2_trained_from_a_config_file_on_a_text_file_exports_to_what_transformers_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user's loop end to end: a text file, a config file, TensorBoard, a checkpoint, ``hintpipe export``,
    ``from_pretrained``; the exported model's loss on the run's held-out batch is the run's last held-out loss."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hintpipe.apps.training import TrainConfig, step_batch

    corpus, board = _text_file(tmp_path / "corpus.txt"), tmp_path / "tb"
    checkpoints, out, toml = tmp_path / "ck", tmp_path / "gpt2", tmp_path / "run.toml"
    toml.write_text(RUN_TOML.format(data=corpus, tensorboard=board, checkpoints=checkpoints))
    assert main(["train", "--config", str(toml), "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert [entry["steps"] for entry in run["eval_losses"]] == [2, 3]
    held_out = run["eval_losses"][-1]["loss"]

    events = EventAccumulator(str(board))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("held_out_loss")] == [
        (entry["steps"], pytest.approx(entry["loss"], rel=1e-6)) for entry in run["eval_losses"]
    ]  # float32 on disk
    assert [e.value for e in events.Scalars("loss")] == pytest.approx(run["losses"], rel=1e-6)
    assert [e.value for e in events.Scalars("learning_rate")] == pytest.approx(run["learning_rates"], rel=1e-6)

    assert main(["export", str(checkpoints), str(out), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    files = ["config.json", "generation_config.json", "model.safetensors"]
    assert said == {
        "out_dir": str(out), "step": 3, "architecture": "GPT2LMHeadModel", "dtype": "fp32", "files": files, "notes": [],
    }  # fmt: skip

    model = transformers.GPT2LMHeadModel.from_pretrained(out)
    assert (model.config.vocab_size, model.config.n_positions) == (256, 256)  # bytes, not GPT-2's defaults
    merged = load_merged(checkpoints)
    state = model.state_dict()
    assert state.keys() == merged.keys()
    for name, tensor in merged.items():
        assert torch.equal(state[name], tensor), name
    assert model.lm_head.weight is model.transformer.wte.weight
    # In bf16: half the size, config.json records it, from_pretrained(dtype="auto") loads the tensors cast.
    assert main(["export", str(checkpoints), str(tmp_path / "gpt2-bf16"), "--dtype", "bf16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dtype"] == "bf16"
    half = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2-bf16", dtype="auto")
    assert half.config.dtype == torch.bfloat16
    for name, tensor in half.state_dict().items():
        assert torch.equal(tensor, merged[name].to(torch.bfloat16)), name
    sizes = [(folder / "model.safetensors").stat().st_size for folder in (out, tmp_path / "gpt2-bf16")]
    assert sizes[1] < 0.51 * sizes[0]

    config = TrainConfig.of(
        model=ModelConfig("hf-gpt2", layers=2, hidden=32, vocab=256), ranks=2, microbatches=2, microbatch_size=2,
        data=str(corpus), seed=0,
    )  # fmt: skip
    inputs, targets, _ = step_batch(config, HELD_OUT_STEP)  # the held-out paragraphs, as the run drew them
    model.train(False)  # dropout is off in this config either way
    with torch.no_grad():
        logits = [model(x, use_cache=False).logits for x in inputs]
    losses = [float(F.cross_entropy(z.flatten(0, 1), y.flatten())) for z, y in zip(logits, targets, strict=True)]
    assert sum(losses) / len(losses) == pytest.approx(held_out, rel=1e-5)


def test_a_built_in_model_exports_as_safetensors_that_hintpipe_s_builder_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    checkpoints, out = tmp_path / "ck", tmp_path / "gpt-mini"
    result = train(small_run(steps=2, checkpoint_dir=str(checkpoints)))
    assert result is not None and result.state is not None

    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "safetensors.torch", None)  # as if not installed
        with pytest.raises(ExportError) as refused:
            export_checkpoint(checkpoints, out)
        assert str(refused.value) == "exporting gpt-mini needs safetensors: pip install -e '.[export]'"
    assert not out.exists()

    done = export_checkpoint(checkpoints / "step-00000002", out)
    assert (done.step, done.architecture, done.files) == (2, "gpt-mini", ("hintpipe_model.json", "model.safetensors"))
    config = ModelConfig(**json.loads((out / "hintpipe_model.json").read_text()))
    assert config == small_run().model
    model = whole_model(config)[0]
    model.load_state_dict(load_file(out / "model.safetensors"), strict=True)
    rebuilt = model.state_dict()
    assert rebuilt.keys() == result.state.keys() == load_merged(checkpoints).keys()
    assert all(torch.equal(rebuilt[k], result.state[k]) for k in rebuilt)
    half = export_checkpoint(checkpoints, tmp_path / "gpt-mini-fp16", dtype="fp16")
    saved = load_file(tmp_path / "gpt-mini-fp16" / "model.safetensors")
    assert half.dtype == "fp16" and {t.dtype for t in saved.values()} == {torch.float16}
    assert all(torch.equal(saved[k], result.state[k].to(torch.float16)) for k in saved)
    with pytest.raises(ValueError, match=r"^unknown dtype 'int8': choose one of fp32, bf16, fp16$"):
        export_checkpoint(checkpoints, tmp_path / "never", dtype="int8")

    # A manifest that describes another model than its tensors are (rewritten, with its digest) is refused.
    other = tmp_path / "other" / "step-00000002"
    shutil.copytree(checkpoints / "step-00000002", other)
    manifest = Manifest.read(other)
    described = describe_model(ModelConfig("hf-gpt2", layers=1, hidden=16))
    Manifest(2, dataclasses.replace(manifest.identity, model=described), manifest.files).write(other)
    with pytest.raises(ExportError) as refused:
        export_checkpoint(other, tmp_path / "other-out")
    assert str(refused.value).startswith(
        f"{other}'s tensors do not load into the GPT2LMHeadModel its manifest describes: Error(s) in loading "
        'state_dict for GPT2LMHeadModel: Missing key(s) in state_dict: "transformer.wte.weight"'
    )
    assert not (tmp_path / "other-out").exists()

    (out / "notes.txt").write_text("mine")
    (out / "config.json").write_text("{}")  # an earlier export's: contradicts this one, so it goes
    again = export_checkpoint(checkpoints, out, force=True)
    assert again.files == done.files
    assert sorted(p.name for p in out.iterdir()) == ["hintpipe_model.json", "model.safetensors", "notes.txt"]
