"""``hintpipe train --model FOLDER``: any Hugging Face causal LM from the folder ``save_pretrained`` wrote, trained
from its weights, as users fine-tune.

A zoo of architectures (tests/hf_zoo.py: GPT-2, Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma-2, GPT-NeoX, OPT, and
the mixtures of experts Mixtral and Qwen2-MoE),
each saved with a tokenizer, is trained for 2 steps on 2 ranks from the command line's own config (the run
``hintpipe train`` starts, on one shared spawned group): the first step's loss is the unsplit model's loss on
the same batch (rel 1e-5), ``--check-grads`` finds every gradient within its tolerance, the run used the
folder's tokenizer, and the export loads with ``from_pretrained`` holding exactly the checkpoint's tensors,
the tokenizer beside them. Then every refusal of a wrong model or folder, by its exact text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import hf_zoo
from conftest import allow, parse_cli
from groups import Case, run_cases, succeeded
from hintpipe.apps.export import export_checkpoint
from hintpipe.apps.gradcheck import RELATIVE_TOLERANCE
from hintpipe.apps.models import lm_loss
from hintpipe.apps.train_config import TrainConfig
from hintpipe.apps.training import _train_rank, step_batch
from hintpipe.cli import main
from hintpipe.cli.train import config_from
from hintpipe.runtime.checkpoint.merged import load_merged

ARCHITECTURES = tuple(hf_zoo.ARCHITECTURES)
RUN = ["--ranks", "2", "--microbatches", "2", "--microbatch-size", "2", "--steps", "2", "--policy", "fixed"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    corpus = hf_zoo.corpus(root / "corpus.txt")
    for name in ARCHITECTURES:
        hf_zoo.save_model(name, root / name, corpus)
    return root


def _config(zoo: Path, name: str, *more: str) -> TrainConfig:
    argv = ["train", "--model", str(zoo / name), *RUN, "--data", str(zoo / "corpus.txt"), "--check-grads", *more]
    args = parse_cli(argv)
    return config_from(args, args.policy)


@pytest.fixture(scope="module")
def configs(zoo: Path) -> dict[str, TrainConfig]:
    return {name: _config(zoo, name, "--checkpoint-dir", str(zoo / f"{name}-run")) for name in ARCHITECTURES}


@pytest.fixture(scope="module")
def factory_config(zoo: Path) -> TrainConfig:
    """The user's own module (tests/hf_zoo.py's ``user_model``), on the same corpus with a byte tokenizer."""
    args = parse_cli(["train", "--model", "hf_zoo:user_model", *RUN, "--seq-len-dist", "fixed:16", "--check-grads"])
    return config_from(args, args.policy)


@pytest.fixture(scope="module")
def runs(configs: dict[str, TrainConfig], factory_config: TrainConfig) -> dict[str, list[Any]]:
    cases = {name: Case(_train_rank, (config,)) for name, config in configs.items()}
    cases["factory"] = Case(_train_rank, (factory_config,))
    return run_cases(2, cases, timeout=240)


def _unsplit_loss(folder: Path, config: TrainConfig) -> float:
    """The first step's loss on the unsplit model as ``from_pretrained`` loads it: the mean over the step's
    micro-batches of each one's mean next-token loss."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    inputs, targets, _ = step_batch(config, 0)
    with torch.no_grad():
        losses = [lm_loss(model(x, use_cache=False).logits, y) for x, y in zip(inputs, targets, strict=True)]
    return float(torch.stack(losses).mean())


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_model_folder_trains_from_its_weights_as_the_unsplit_model(
    name: str, zoo: Path, configs: dict[str, TrainConfig], runs: dict[str, list[Any]]
) -> None:
    config = configs[name]
    assert config.model.name == "hf-folder" and config.model.init == "pretrained"
    assert config.plan is not None and not config.plan.graph.follows_autocast  # float32: captured once
    assert config.data.tokenizer == str(zoo / name)  # the folder's own, unasked
    result = succeeded(runs[name])[0]
    assert result.losses[0] == pytest.approx(_unsplit_loss(zoo / name, config), rel=1e-5)
    assert result.max_grad_rel_diff is not None and result.max_grad_rel_diff <= RELATIVE_TOLERANCE


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_the_export_is_the_checkpoint_and_the_tokenizer(
    name: str, zoo: Path, runs: dict[str, list[Any]], tmp_path: Path
) -> None:
    succeeded(runs[name])
    done = export_checkpoint(zoo / f"{name}-run", tmp_path / "out")
    assert done.notes == () and {"tokenizer.json", "tokenizer_config.json"} <= set(done.files)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    saved = load_merged(zoo / f"{name}-run")
    state = loaded.state_dict()
    assert set(saved) <= set(state)
    for key, tensor in saved.items():
        assert torch.equal(state[key], tensor), key
    assert not torch.equal(saved[next(iter(saved))], _original(zoo / name)[next(iter(saved))])  # it trained
    text = "pipeline stage rank tensor"
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert exported(text)["input_ids"] == transformers.AutoTokenizer.from_pretrained(zoo / name)(text)["input_ids"]


def test_a_user_s_own_module_trains_from_the_command_line_as_in_python(
    factory_config: TrainConfig, runs: dict[str, list[Any]]
) -> None:
    assert (factory_config.model.name, factory_config.model.vocab, factory_config.model.max_seq_len) == (
        "factory",
        hf_zoo.VOCAB,
        33,
    )
    result = succeeded(runs["factory"])[0]
    model, _, loss_fn = hf_zoo.user_model()
    inputs, targets, _ = step_batch(factory_config, 0)
    with torch.no_grad():
        unsplit = torch.stack([loss_fn(model(x), y) for x, y in zip(inputs, targets, strict=True)]).mean()
    assert result.losses[0] == pytest.approx(float(unsplit), rel=1e-5)
    assert result.max_grad_rel_diff is not None and result.max_grad_rel_diff <= RELATIVE_TOLERANCE


def test_a_factory_of_the_wrong_shape_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    train = ["train", "--ranks", "2", "--microbatches", "2", "--steps", "1"]
    assert _error([*train, "--model", "hf_zoo:corpus_missing"], capsys) == (
        "hintpipe train: error: --model hf_zoo:corpus_missing: hf_zoo has no function corpus_missing\n"
    )
    assert _error([*train, "--model", "no_such_module:make"], capsys) == (
        "hintpipe train: error: --model no_such_module:make: cannot import no_such_module (No module named "
        "'no_such_module')\n"
    )


def _original(folder: Path) -> dict[str, torch.Tensor]:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()


def test_init_random_is_the_folder_s_config_with_weights_from_the_seed(zoo: Path) -> None:
    config = _config(zoo, "llama", "--init", "random", "--seed", "3")
    assert config.plan is not None
    planned = dict(config.plan.graph.module.named_parameters())
    torch.manual_seed(3)
    fresh = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        transformers.AutoConfig.from_pretrained(zoo / "llama"), dtype=torch.float32
    )
    pretrained = _original(zoo / "llama")
    for key, tensor in fresh.named_parameters():
        assert torch.equal(planned[key], tensor), key
    assert not torch.equal(
        planned["model.layers.0.mlp.up_proj.weight"], pretrained["model.layers.0.mlp.up_proj.weight"]
    )


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_wrong_models_and_folders_are_one_line(zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = ["train", "--ranks", "2", "--microbatches", "2", "--steps", "1"]
    assert _error([*train, "--model", "gpt-nano"], capsys) == (
        "hintpipe train: error: --model gpt-nano: not a built-in model (mlp, gpt-mini, mm-mini, hf-gpt2, "
        "hf-llama), a model folder (save_pretrained) or module:function; a Hugging Face Hub model is read from this "
        "machine's cache: huggingface-cli download gpt-nano first\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _error([*train, "--model", str(empty)], capsys) == (
        f"hintpipe train: error: --model {empty}: the folder has no config.json; give a folder written by a "
        "Hugging Face model's save_pretrained, a built-in model or module:function\n"
    )
    folder = str(zoo / "gpt2")
    assert _error([*train, "--model", folder, "--layers", "4", "--hidden", "8"], capsys) == (
        f"hintpipe train: error: --layers --hidden: --model {folder} is sized by its own config; leave --layers "
        "--hidden out\n"
    )
    assert _error([*train, "--init", "pretrained"], capsys) == (
        "hintpipe train: error: --init pretrained: --model gpt-mini is a built-in model, its weights always start "
        "from --seed; --init is for a model folder\n"
    )
    assert _error([*train, "--checkpoint-dir", folder], capsys) == (
        f"hintpipe train: error: --checkpoint-dir {folder} is a model folder (config.json, generation_config.json, "
        "model.safetensors, tokenizer.json and 1 more), not a run's checkpoint folder: give a new or empty folder "
        "for the run's checkpoints (nothing was written)\n"
    )
    assert sorted(p.name for p in (zoo / "gpt2").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"
    ]  # fmt: skip


def test_a_folder_of_another_head_or_a_model_that_sees_ahead_is_refused(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, each trained without a word: the classifier's folder with its LM head drawn at random (its own
    # dropped), the masked LM with attention that sees the token it predicts (its loss falls, it learns nothing).
    untied = hf_zoo.ARCHITECTURES["llama"]()
    untied.tie_word_embeddings, untied.num_labels = False, 3
    torch.manual_seed(0)
    classifier = transformers.LlamaForSequenceClassification(untied)  # type: ignore[no-untyped-call]
    classifier.save_pretrained(tmp_path / "classifier")
    masked = transformers.BertConfig(
        vocab_size=hf_zoo.VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    transformers.BertForMaskedLM(masked).save_pretrained(tmp_path / "bert")
    for folder in ("classifier", "bert"):
        hf_zoo.save_tokenizer(tmp_path / folder, zoo / "corpus.txt")
    capsys.readouterr()  # (save_pretrained's bars)
    train = ["train", "--ranks", "2", "--microbatches", "2", "--steps", "1", "--data", str(zoo / "corpus.txt")]
    assert _error([*train, "--model", str(tmp_path / "classifier")], capsys) == (
        f"hintpipe train: error: --model {tmp_path / 'classifier'} holds a LlamaForSequenceClassification, not the "
        "weights of LlamaForCausalLM (it lacks lm_head.weight; it holds score.weight): hintpipe fine-tunes a causal "
        "language model from all of its weights; give the folder of a causal LM's save_pretrained, or --init random\n"
    )
    for init in ("pretrained", "random"):
        assert _error([*train, "--model", str(tmp_path / "bert"), "--init", init], capsys) == (
            f"hintpipe train: error: --model {tmp_path / 'bert'} is not a causal language model: its logits at one "
            "position change with a later token (its attention sees the tokens it is to predict; a BERT-like model "
            "wants is_decoder in its config.json)\n"
        )
    masked.is_decoder = True  # a BERT made a decoder is causal, and trains
    transformers.BertLMHeadModel(masked).save_pretrained(tmp_path / "bert")
    args = parse_cli([*train, "--model", str(tmp_path / "bert")])
    assert config_from(args, args.policy).plan is not None
    # A causal LM's folder with tensors beyond its model trains: the hub's GPT-2 keeps attn.masked_bias buffers.
    from safetensors.torch import load_file, save_file

    shutil.copytree(zoo / "gpt2", tmp_path / "gpt2")
    weights = load_file(tmp_path / "gpt2" / "model.safetensors")
    extra = {f"transformer.h.{i}.attn.masked_bias": torch.tensor(-1e4) for i in range(2)}
    save_file(weights | extra, tmp_path / "gpt2" / "model.safetensors", metadata={"format": "pt"})
    args = parse_cli([*train, "--model", str(tmp_path / "gpt2")])
    assert config_from(args, args.policy).plan is not None


def test_max_seq_len_beside_a_folder_is_the_context_it_trains_on(zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: "--max-seq-len: --model ... is sized by its own config", so a model of 131,072 positions trained on
    # rows up to that long (every row, under --forming concat), with no way to say less.
    config = _config(zoo, "llama", "--max-seq-len", "16", "--forming", "concat")
    assert (config.model.max_seq_len, config.model.source) == (16, str(zoo / "llama"))
    inputs, _, tokens = step_batch(config, 0)
    assert [tuple(x.shape) for x in inputs] == [(2, 15)] * 2 and tokens == [30, 30]
    folder = str(zoo / "llama")
    train = ["train", "--model", folder, "--ranks", "2", "--microbatches", "2", "--steps", "1"]
    assert _error([*train, "--max-seq-len", "65"], capsys) == (
        f"hintpipe train: error: --max-seq-len 65: {folder}'s positions end at 64 tokens; give the context it trains "
        "on, 2 to 64\n"
    )
    assert _error([*train, "--max-seq-len", "16", "--layers", "4"], capsys) == (
        f"hintpipe train: error: --layers: --model {folder} is sized by its own config; leave --layers out\n"
    )


def test_a_folder_whose_config_maps_to_its_own_code_is_refused(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "remote"
    folder.mkdir()
    said = json.loads((zoo / "llama" / "config.json").read_text())
    said["auto_map"] = {"AutoModelForCausalLM": "modeling.Model"}
    (folder / "config.json").write_text(json.dumps(said))
    (folder / "modeling.py").write_text("raise SystemExit('code from the folder ran')\n")
    assert _error(["train", "--ranks", "2", "--microbatches", "2", "--model", str(folder)], capsys) == (
        f"hintpipe train: error: --model {folder}: its config.json maps to Python code in the folder (auto_map), "
        "and hintpipe runs no code from a model folder; use a model class that transformers ships\n"
    )


def test_under_torchrun_rank_0_plans_and_every_rank_trains_its_plan(zoo: Path, runs: dict[str, list[Any]]) -> None:
    # Before, every rank planned on its own: their cuts differed (they rest on measured times) and the run
    # stopped, 3 times in 4, with "ranks [1] hold another plan". Now rank 0 plans and its ranks receive it.
    import subprocess
    import sys

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    unsaid = RUN.index("--ranks")  # a pipeline of torchrun's 2 ranks, unsaid
    argv = [*torchrun, "-m", "hintpipe", "train", "--model", str(zoo / "gpt2"), *RUN[:unsaid], *RUN[unsaid + 2 :]]
    argv += ["--data", str(zoo / "corpus.txt"), "--check-grads", "--timeout", "120", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=allow(300), cwd=zoo)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout)  # rank 0's report alone
    spawned = succeeded(runs["gpt2"])[0]
    assert said["losses"] == pytest.approx(list(spawned.losses), rel=1e-5)
    assert said["max_grad_rel_diff"] <= RELATIVE_TOLERANCE
    # transformers' "Loading weights" bar, drawn by every load of the folder on every rank before, is off.
    assert "Loading weights" not in done.stderr, done.stderr[-3000:]


def test_the_readme_s_fine_tune_runs_and_its_printed_config_runs_it_again(
    zoo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import re
    import shutil

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.findall(r"^```toml\n(.*?)^```", readme, flags=re.DOTALL | re.MULTILINE)[0]
    assert 'model = "gpt2-small"' in block
    shutil.copytree(zoo / "gpt2", tmp_path / "gpt2-small")  # a saved pretrained GPT-2, its tokenizer beside it
    shutil.copy(zoo / "corpus.txt", tmp_path / "corpus.txt")
    documents = (zoo / "corpus.txt").read_text().split("\n\n")
    (tmp_path / "valid.txt").write_text("\n\n".join(documents[::-1][:40]))  # a validation file of its own
    monkeypatch.chdir(tmp_path)
    Path("finetune.toml").write_text(block)
    assert main(["train", "--config", "finetune.toml", "--print-config"]) == 0
    Path("printed.toml").write_text(capsys.readouterr().out)
    assert main(["train", "--config", "finetune.toml", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    # The printed file is the whole run: fed back (into a folder of its own), it trains to the same losses.
    assert main(["train", "--config", "printed.toml", "--checkpoint-dir", "ck-again", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert len(first["losses"]) == 3 and again["losses"] == pytest.approx(first["losses"], rel=1e-5)
    assert [e["steps"] for e in first["eval_losses"]] == [3] and len(first["prepared_eval_data"]) == 1
    losses = [[e["loss"] for e in run["eval_losses"]] for run in (first, again)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert main(["export", "ck", "gpt2-finetuned"]) == 0
    assert "tokenizer.json" in capsys.readouterr().out
    tuned = transformers.AutoModelForCausalLM.from_pretrained("gpt2-finetuned")
    assert type(tuned).__name__ == "GPT2LMHeadModel"


def test_a_plan_file_is_not_a_folder(zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(zoo / "gpt2")
    assert _error(["train", "--plan", folder, "--steps", "1"], capsys) == (
        f"hintpipe train: error: --plan {folder} is a folder: a plan is a file `hintpipe plan ... --save FILE` "
        "writes; to train a model folder, give it to --model\n"
    )


def test_a_plan_made_in_python_is_described_as_the_model_it_planned(zoo: Path) -> None:
    # TrainConfig.of(plan=...) beside the default ModelConfig described gpt-mini: the export wrote another model
    # (dropout 0.0 for a model of 0.1), or failed after training.
    import dataclasses

    import hintpipe
    from hintpipe.apps.models import ModelConfig
    from hintpipe.apps.run_model import run_description

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    planned = hintpipe.plan(model, torch.zeros(2, 8, dtype=torch.int64), ranks=2, microbatches=2, repeats=1,
                            kwargs={"use_cache": False})  # fmt: skip
    config = TrainConfig.of(model=ModelConfig(vocab=64), ranks=2, microbatches=2, plan=planned)
    said = run_description(config)
    assert said is not None and said["architecture"] == "GPT2LMHeadModel" and "hintpipe_model" not in said
    assert said["config"]["resid_pdrop"] == 0.1 and said["config"]["n_layer"] == 2
    own = hintpipe.plan(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)), torch.zeros(2, 4), ranks=2, microbatches=2,
        repeats=1,
    )  # fmt: skip
    assert own.hf_model is None
    assert run_description(dataclasses.replace(config, plan=own)) is None  # not described as gpt-mini


def test_every_kind_of_model_is_one_row_that_says_what_it_supports() -> None:
    # The command line asks a model's row, never its name: a kind's builders are named by dotted path, and
    # each one named resolves.
    from hintpipe.apps.model_spec import BUILT_IN, MODEL_SPECS, SOURCED

    assert BUILT_IN == ("mlp", "gpt-mini", "mm-mini", "hf-gpt2", "hf-llama") and SOURCED == ("hf-folder", "factory")
    for spec in MODEL_SPECS.values():
        assert callable(spec.builder()) and callable(spec.batch_maker())
        assert spec.planned != spec.layer_list, spec.name
        if spec.layer_list:
            assert callable(spec.layer_builder())
        if spec.sourced:
            assert callable(spec.sizer())
    with pytest.raises(ValueError, match=r"^hf-gpt2 is planned from its graph, not built as a list of layers$"):
        MODEL_SPECS["hf-gpt2"].layer_builder()


def test_a_dropout_the_model_does_not_have_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    train = ["train", "--ranks", "2", "--microbatches", "2", "--steps", "1"]
    assert _error([*train, "--dropout", "0.1"], capsys) == (
        "hintpipe train: error: --model gpt-mini: gpt-mini has no dropout; leave dropout out (the hf-* models take "
        "it)\n"
    )


def test_a_plan_file_saved_in_python_with_a_description_alone_trains(zoo: Path, tmp_path: Path) -> None:
    # It was refused as "fields are not a plan's (no field 'name')": the command line knew only its own files.
    import hintpipe

    model = transformers.AutoModelForCausalLM.from_pretrained(zoo / "qwen2", dtype=torch.float32)
    planned = hintpipe.plan(model, torch.zeros(2, 8, dtype=torch.int64), ranks=2, microbatches=2, repeats=1,
                            kwargs={"use_cache": False})  # fmt: skip
    path = tmp_path / "qwen2.plan"
    hintpipe.save_plan(planned, path, model=hintpipe.hf_description(model))
    config = config_from(*_parsed(["train", "--plan", str(path), "--steps", "1", "--seq-len-dist", "fixed:16"]))
    assert (config.model.name, config.model.vocab, config.model.source) == ("hf-folder", hf_zoo.VOCAB, str(path))
    assert config.plan is not None and config.plan.fingerprint == planned.fingerprint
    for key, tensor in model.named_parameters():
        assert torch.equal(dict(config.plan.graph.module.named_parameters())[key], tensor), key


def test_a_plan_file_for_float32_alone_is_refused_under_bf16_before_the_ranks_start(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import hintpipe

    model = transformers.AutoModelForCausalLM.from_pretrained(zoo / "gpt2", dtype=torch.float32)
    planned = hintpipe.plan(model, torch.zeros(2, 8, dtype=torch.int64), ranks=2, microbatches=2, repeats=1,
                            kwargs={"use_cache": False}, autocast=False)  # fmt: skip
    path = tmp_path / "gpt2.plan"
    hintpipe.save_plan(planned, path, model=hintpipe.hf_description(model))
    argv = ["train", "--plan", str(path), "--steps", "1", "--seq-len-dist", "fixed:16", "--precision", "bf16"]
    capsys.readouterr()  # (loading the folder's weights drew a progress bar)
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"hintpipe train: error: --plan {path} was planned for float32 alone (autocast=False), and --precision bf16 "
        "runs its stages under a bfloat16 autocast: plan it with autocast=True (hintpipe plan does)\n"
    )


def _parsed(argv: list[str]) -> tuple[Any, Any]:
    args = parse_cli(argv)
    return args, args.policy


def test_a_model_this_machine_cannot_hold_is_refused_before_it_is_built(capsys: pytest.CaptureFixture[str]) -> None:
    # The launcher built the whole model to count its layers: --layers 1000000000 ran 78 s into std::bad_alloc.
    from hintpipe.cli.train_checks import available_memory

    said = _error(["train", "--ranks", "2", "--microbatches", "2", "--layers", "1000000000"], capsys)
    available = available_memory()
    assert available is not None
    assert said.startswith(
        "hintpipe train: error: --model gpt-mini of --layers 1000000000 --hidden 64 has 49,984,000,033,024 "
        "parameters (186205GiB in float32); each of the 2 ranks builds it whole: about 372410GiB, over the "
    )
    assert said.endswith(" this machine has available; use a smaller model\n")


def test_a_tensorboard_file_is_refused_before_the_ranks_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The ranks started and failed 22.7 s later.
    file = tmp_path / "tb"
    file.write_text("")
    said = _error(["train", "--ranks", "2", "--microbatches", "2", "--tensorboard", str(file)], capsys)
    assert said == f"hintpipe train: error: --tensorboard {file} is a file; TensorBoard writes into a folder\n"
    steps = _error(["train", "--ranks", "2", "--microbatches", "2", "--steps", "9223372036854775807"], capsys)
    last = steps.splitlines()[-1]  # after argparse's usage line
    assert last == "hintpipe: error: argument --steps: must be at most 2147483647, got 9223372036854775807"
