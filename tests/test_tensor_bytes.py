"""Bytes of tensors as autograd holds them (:mod:`hintpipe.tensor_bytes`): each storage once, parameters aside,
so that the planner's profile and the runtime's admission count the same bytes."""

from __future__ import annotations

import torch

from hintpipe.tensor_bytes import count_saved, nbytes, parameter_storages, storage_nbytes, tensors_in


def test_tensors_are_found_inside_containers_and_nothing_else_counts() -> None:
    a, b, c = torch.zeros(2), torch.zeros(3), torch.zeros(4, dtype=torch.float64)
    found = tensors_in({"x": (a, [b, "text", 3]), "y": c, "z": None})
    assert [t.numel() for t in found] == [2, 3, 4]
    assert nbytes({"x": (a, [b, "text", 3]), "y": c}) == 4 * 2 + 4 * 3 + 8 * 4


def test_views_of_one_storage_are_counted_once_by_their_storage() -> None:
    whole = torch.zeros(10)
    thirds = whole[:3], whole[3:6], whole[6:]
    assert nbytes(thirds) == 4 * 10  # each view's own elements
    assert storage_nbytes(thirds) == 4 * 10  # one storage
    assert storage_nbytes([whole[:1]]) == 4 * 10  # a view holds its whole storage alive
    assert storage_nbytes([whole, whole, torch.zeros(2)]) == 4 * 12


def test_what_autograd_saves_is_counted_once_per_storage_and_parameters_are_left_out() -> None:
    linear = torch.nn.Linear(8, 8, bias=False)
    x = torch.randn(5, 8, requires_grad=True)
    with count_saved(parameter_storages(linear)) as counted:
        hidden = linear(x)  # saves x (and its weight, a parameter)
        torch.tanh(hidden).sum()  # saves tanh's output
        (hidden * hidden).sum()  # saves hidden, twice: one storage
    assert counted.total == 4 * (5 * 8 + 5 * 8 + 5 * 8)
    assert sorted(counted.sizes.values()) == [160, 160, 160]
