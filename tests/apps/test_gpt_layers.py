"""gpt-mini's layers (:mod:`hintpipe.apps.gpt_layers`): packed rows attend and count positions within each
document as the documents would alone, an unfused block computes what the fused one did, and the synthetic text
counts up."""

from __future__ import annotations

import torch

from hintpipe.apps.gpt_layers import Block, Embedding, counting_text, document_mask, document_positions
from hintpipe.apps.model_config import ModelConfig

CONFIG = ModelConfig("gpt-mini", layers=1, hidden=16, heads=2, vocab=32, max_seq_len=16)


def test_positions_and_attention_stay_within_each_document_of_a_packed_row() -> None:
    documents = torch.tensor([[0, 0, 0, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert document_positions(documents).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]
    mask = document_mask(documents)
    assert mask.shape == (2, 1, 6, 6)
    assert mask[0, 0, 4].tolist() == [False, False, False, True, True, False]  # its document, up to itself
    assert mask[1, 0].equal(torch.ones(6, 6, dtype=torch.bool).tril())  # one document: causal


def test_a_packed_row_computes_each_document_as_it_would_alone() -> None:
    torch.manual_seed(0)
    embedding, block = Embedding(CONFIG), Block(CONFIG)
    first, second = torch.randint(0, 32, (1, 4)), torch.randint(0, 32, (1, 3))
    packed = torch.cat([first, second], dim=1)
    documents = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    out, carried = block(*embedding(packed, documents))
    assert carried is documents
    alone = torch.cat([block(embedding(first)), block(embedding(second))], dim=1)
    torch.testing.assert_close(out, alone)


def test_an_unfused_block_computes_what_the_fused_one_did() -> None:
    torch.manual_seed(0)
    block = Block(CONFIG)
    x = torch.randn(2, 5, 16)
    before = block(x)
    block.unfuse_qkv()
    assert not hasattr(block, "qkv") and [block.get_submodule(n).out_features for n in "qkv"] == [16, 16, 16]
    torch.testing.assert_close(block(x), before)


def test_the_synthetic_text_counts_up_from_each_rows_start_with_one_shift() -> None:
    starts = torch.tensor([[3], [30]])
    text = counting_text(starts, 9, 32, torch.Generator().manual_seed(0))
    assert text.shape == (2, 10) and int(text.min()) >= 0 and int(text.max()) < 32  # modulo the vocabulary
    shifted = (text - starts - torch.arange(10)) % 32  # what each token is off the count by
    amounts = set(shifted.flatten().tolist()) - {0}
    assert len(amounts) == 1  # one random amount, for every shifted token
    assert 0 < int((shifted != 0).sum()) < 10  # about a tenth of the 20 tokens
