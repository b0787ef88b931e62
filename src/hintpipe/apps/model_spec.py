"""Each kind of model the command line trains, as one row: what builds it and what it supports.

``hintpipe train --model X`` asks the row of ``X``'s kind, never the model's name: adding a kind of model is
a module that builds it and one row here (torchtitan's ``TrainSpec`` has the same shape). The builders are
named by dotted path and imported only when a model is built, so that this table, like the command line
that reads it, imports no torch.

What ``--model`` may be (:func:`model_kind`): a built-in model's name, a folder written by a Hugging Face
model's ``save_pretrained`` (any ``AutoModelForCausalLM`` whose graph captures), or ``module:function``, a
factory of the user's own (:mod:`hintpipe.apps.factory_model`).

This module is torch-free.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One kind of model.

    Attributes:
        name: the kind's name (a built-in model's is what ``--model`` takes).
        summary: one line for ``--help``.
        build: ``module:function`` of what builds the whole model from a
            :class:`~hintpipe.apps.model_config.ModelConfig`: ``(module, keyword inputs of every call)``.
        planned: the pipeline gets the model from a plan (captured through torch.export, cut by the planner),
            not from a list of layers cut evenly.
        unit: what a step's throughput counts, ``tokens`` or ``samples``.
        reads_text: trains on token ids: ``--data`` corpora and ``--tokenizer`` apply.
        attention: its ``hidden`` must be a multiple of its ``heads``.
        document_masks: takes packed rows with document masks (``--forming packed``).
        tensor_parallel: has a tensor-parallel plan (``--tp``).
        sourced: ``--model`` names where it comes from (a folder, a factory), not a built-in name.
        layer_list: a list of layers (``--check-grads`` compares layer by layer; ``--layers`` counts them).
        loss: ``module:function`` of what gives its loss from its config ("": next-token cross-entropy for a
            model of token ids, else mean squared error).
        describe: ``module:function`` of what describes it for checkpoints and plan files (plain values that
            rebuild it; "": its ModelConfig's fields, rebuilt by hintpipe).
        sizes: a sourced kind's ``module:function(source, *, init, seed)``, giving its ModelConfig (sizes read
            from the source).
        own_tokenizer: its source is a folder that may hold its tokenizer (used for a corpus unless
            ``--tokenizer`` says another, and exported with it).
        layers: a list-of-layers kind's ``module:function`` building its layers from its config.
        batch: ``module:function`` of what makes a step's micro-batches (``make_batch``'s arguments).
        inputs: the tensors a micro-batch is (several: the layers pass tuples, and the pipeline's first stage
            and last follow the first tensor's size and the last's).
        dropout: takes ``--dropout``.
        source_dropout: a sourced kind's ``module:function(source)`` giving the dropout its source trains with, as
            ``(field, p)``, None where it has none ("": its ``--dropout`` alone).
        resize: how a sourced kind's vocabulary grows to hold more token ids, said in a refusal ("": a model of
            more).
    """

    name: str
    summary: str
    build: str
    planned: bool = False
    unit: str = "tokens"
    reads_text: bool = True
    attention: bool = True
    document_masks: bool = False
    tensor_parallel: bool = False
    sourced: bool = False
    layer_list: bool = False
    loss: str = ""
    describe: str = ""
    sizes: str = ""
    own_tokenizer: bool = False
    layers: str = ""
    batch: str = "hintpipe.apps.models:text_batch"
    inputs: int = 1
    dropout: bool = False
    source_dropout: str = ""
    resize: str = ""

    def builder(self) -> Any:
        """The function :attr:`build` names, imported now."""
        return _imported(self.build)

    def loss_maker(self) -> Any:
        """The function :attr:`loss` names, imported now (None: the default loss)."""
        return _imported(self.loss) if self.loss else None

    def describer(self) -> Any:
        """The function :attr:`describe` names, imported now (None: the ModelConfig's fields)."""
        return _imported(self.describe) if self.describe else None

    def layer_builder(self) -> Any:
        """The function :attr:`layers` names, imported now.

        Raises:
            ValueError: a planned kind (no list of layers).
        """
        if not self.layers:
            raise ValueError(f"{self.name} is planned from its graph, not built as a list of layers")
        return _imported(self.layers)

    def dropout_of(self, source: str) -> tuple[str, float] | None:
        """The dropout ``source`` trains with (:attr:`source_dropout`), as ``(field, p)``; None where it has none, or
        the kind reads none from its source."""
        found: tuple[str, float] | None = _imported(self.source_dropout)(source) if self.source_dropout else None
        return found

    def batch_maker(self) -> Any:
        """The function :attr:`batch` names, imported now."""
        return _imported(self.batch)

    def sizer(self) -> Any:
        """The function :attr:`sizes` names, imported now."""
        return _imported(self.sizes)


def _imported(path: str) -> Any:
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


_LAYERS = "hintpipe.apps.models:whole_layer_model"
_HF = "hintpipe.apps.hf_models:whole_hf_model"
_SAID = "hintpipe.apps.hf_models:built_in_description"
#: Every kind of model, by name; the built-ins first, in ``--help``'s order.
MODEL_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "mlp",
            "a stack of Linear + Tanh layers on random inputs",
            _LAYERS,
            unit="samples",
            reads_text=False,
            attention=False,
            layer_list=True,
            layers="hintpipe.apps.models:mlp_layers",
            batch="hintpipe.apps.models:mlp_batch",
        ),
        ModelSpec(
            "gpt-mini",
            "a small causal transformer (embedding, blocks, head)",
            _LAYERS,
            document_masks=True,
            tensor_parallel=True,
            layer_list=True,
            layers="hintpipe.apps.models:gpt_layers",
        ),
        ModelSpec(
            "mm-mini",
            "an image encoder and a text decoder",
            _LAYERS,
            layer_list=True,
            layers="hintpipe.apps.multimodal:build_multimodal_layers",
            batch="hintpipe.apps.multimodal:make_multimodal_batch",
            inputs=2,
        ),
        ModelSpec(
            "hf-gpt2",
            "transformers' GPT2LMHeadModel, sized by the flags",
            _HF,
            planned=True,
            describe=_SAID,
            dropout=True,
        ),
        ModelSpec(
            "hf-llama",
            "transformers' LlamaForCausalLM, sized by the flags",
            _HF,
            planned=True,
            describe=_SAID,
            dropout=True,
        ),
        ModelSpec(
            "hf-folder",
            "a Hugging Face causal LM's folder (save_pretrained): its weights or, with --init random, its config",
            "hintpipe.apps.hf_folder:whole_folder_model",
            planned=True,
            attention=False,
            sourced=True,
            describe="hintpipe.apps.hf_folder:folder_description",
            sizes="hintpipe.apps.hf_folder:folder_sizes",
            own_tokenizer=True,
            source_dropout="hintpipe.apps.hf_folder:folder_dropout",
            resize="model.resize_token_embeddings({vocab}), then save_pretrained",
        ),
        ModelSpec(
            "factory",
            "module:function returning the user's own nn.Module, an example batch and its loss",
            "hintpipe.apps.factory_model:whole_factory_model",
            planned=True,
            loss="hintpipe.apps.factory_model:factory_loss",
            sizes="hintpipe.apps.factory_model:factory_sizes",
            attention=False,
            sourced=True,
        ),
    )
}
#: The model a command trains or plans when ``--model`` is not given.
DEFAULT_MODEL = "gpt-mini"
#: The built-in models' names, as ``--model`` takes them.
BUILT_IN = tuple(name for name, spec in MODEL_SPECS.items() if not spec.sourced)
#: The kinds whose ``--model`` is a source.
SOURCED = tuple(name for name, spec in MODEL_SPECS.items() if spec.sourced)
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


#: The files a saved tokenizer leaves in a folder (any one of them says a tokenizer is there).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def tokenizer_of(folder: str) -> str | None:
    """The folder itself where a tokenizer was saved into it (a model folder's own tokenizer), else None."""
    return folder if any(Path(folder, name).is_file() for name in TOKENIZER_FILES) else None


def model_kind(text: str) -> tuple[str, str | None]:
    """What ``--model TEXT`` names: ``(kind, source)``, the source an absolute folder or ``module:function``.

    Raises:
        ValueError: in one line, naming the three forms ``--model`` takes.
    """
    if text in BUILT_IN:
        return text, None
    path = Path(text)
    cached = None if path.exists() or _FACTORY.fullmatch(text) else cached_hub_model(text)
    if cached is not None:  # [Note: a Hub model from this machine's cache]
        path = cached
    if path.is_dir():
        if (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
            raise ValueError(
                f"--model {text}: a PEFT adapter folder (adapter_config.json), not a model; merge the adapter into "
                "its base model (merge_and_unload) and give the folder save_pretrained writes of that"
            )
        if not (path / "config.json").is_file():
            raise ValueError(
                f"--model {text}: the folder has no config.json; give a folder written by a Hugging Face model's "
                "save_pretrained, a built-in model or module:function"
            )
        return "hf-folder", str(path.resolve())
    if _FACTORY.fullmatch(text) and not path.exists():
        return "factory", text
    hub = f"; a Hugging Face Hub model is read from this machine's cache: huggingface-cli download {text} first"
    raise ValueError(
        f"--model {text}: not a built-in model ({', '.join(BUILT_IN)}), a model folder (save_pretrained) or "
        f"module:function{hub if _hub_id(text) else ''}"
    )


def cached_hub_model(repo_id: str) -> Path | None:
    """The folder of the Hugging Face Hub model ``repo_id`` (``gpt2``, ``Qwen/Qwen2.5-0.5B``) in this machine's
    Hub cache, its newest snapshot of ``main``; None where it is not a repository id, not cached, or
    ``huggingface_hub`` is not installed.

    [Note: a Hub model from this machine's cache]
    ``from_pretrained("gpt2")`` offline reads the Hub cache that an earlier download filled
    (``huggingface-cli download gpt2``, or any ``from_pretrained`` online); ``--model gpt2`` reads the same
    folder, as ``--model DIR`` reads a folder, with ``local_files_only``: hintpipe downloads nothing (a rank on a
    machine without the network, or each of many ranks downloading at once, would fail late). The run records
    the snapshot's folder, so a resume after the cache moved on to a newer snapshot says its model changed.
    """
    if not _hub_id(repo_id):
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError, or a cache it cannot read: not cached
        return None


def _hub_id(text: str) -> bool:
    """Whether ``text`` is a Hub repository id (``name`` or ``owner/name``)."""
    try:
        from huggingface_hub.utils._validators import validate_repo_id
    except ImportError:
        return False
    try:
        validate_repo_id(text)
    except Exception:  # HFValidationError
        return False
    return True
