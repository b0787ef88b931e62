"""Several sources with weights (:mod:`hintpipe.data.mixture`): each document from a source drawn in the weights'
proportion, and one source drawn exactly as a plain list of documents is."""

from __future__ import annotations

import numpy as np

from hintpipe.data.mixture import Mixture, draw_documents

A = tuple(f"a{i}" for i in range(10))
B = tuple(f"b{i}" for i in range(3))


def test_weights_in_any_scale_are_shares() -> None:
    assert Mixture.of((A, B), (7.0, 3.0)).weights == (0.7, 0.3)
    assert Mixture.of((A, B), (1, 3)).weights == (0.25, 0.75)


def test_documents_are_drawn_in_the_weights_proportion_per_document() -> None:
    drawn = draw_documents(Mixture.of((A, B), (7, 3)), np.random.default_rng(0), 4000)
    share = sum(document.startswith("a") for document in drawn) / len(drawn)
    assert abs(share - 0.7) < 0.03 and set(drawn) == set(A) | set(B)  # every document of either source
    few = draw_documents(Mixture.of((A, B), (1, 1)), np.random.default_rng(1), 8)
    assert {d[0] for d in few} == {"a", "b"}  # mixed within a micro-batch's worth


def test_one_source_is_drawn_as_its_documents_alone_are() -> None:
    alone = draw_documents(A, np.random.default_rng(5), 20)
    assert draw_documents(Mixture.of((A,), (1.0,)), np.random.default_rng(5), 20) == alone
    assert alone == [A[int(i)] for i in np.random.default_rng(5).integers(10, size=20)]


def test_the_same_stream_draws_the_same_documents() -> None:
    mixture = Mixture.of((A, B), (1, 2))
    first, second = (mixture.draw(np.random.default_rng([3, 11]), 50) for _ in range(2))
    assert first == second
