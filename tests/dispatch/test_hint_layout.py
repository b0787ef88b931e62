"""A hint laid out for the engine (:mod:`hintpipe.dispatch.layout`): where each position's result goes and where
its remote input comes from, the two the same links seen from either end, and a forecast made once per costs."""

from __future__ import annotations

import numpy as np

from hintpipe.dispatch.cost_model import CostModel
from hintpipe.dispatch.layout import HintLayout
from hintpipe.dispatch.rank_graph import RankGraph
from hintpipe.schedule.generators import generate_hint

HINT = generate_hint("1f1b", 2, 4)


def _layout(like: HintLayout | None = None) -> HintLayout:
    return HintLayout(HINT, [RankGraph(HINT, r) for r in range(2)], like)


def test_each_result_goes_to_the_position_that_takes_it_as_its_input() -> None:
    layout = _layout()
    # 1F1B on 2 ranks: rank 0 runs F0 F1 B0 F2 B1 F3 B2 B3, rank 1 F0 B0 F1 B1 F2 B2 F3 B3.
    assert [kinds.tolist() for kinds in layout.kind] == [[0, 0, 1, 0, 1, 0, 1, 1], [0, 1, 0, 1, 0, 1, 0, 1]]
    assert layout.links == [
        [(1, 0), (1, 2), None, (1, 4), None, (1, 6), None, None],  # each forward to rank 1's forward of it
        [None, (0, 2), None, (0, 4), None, (0, 6), None, (0, 7)],  # each backward to rank 0's backward of it
    ]
    fed = {link: (r, pos) for r, links in enumerate(layout.links) for pos, link in enumerate(links) if link}
    assert {
        (r, pos): source for r, sources in enumerate(layout.sources) for pos, source in enumerate(sources) if source
    } == fed


def test_a_value_is_gathered_for_each_position_by_its_stage_micro_batch_and_kind() -> None:
    values = np.arange(2 * 4 * 3, dtype=float).reshape(2, 4, 3)  # [stage, mb, kind]: 12 s + 3 mb + kind
    assert _layout().gather(values, 1).tolist() == [12.0, 13.0, 15.0, 16.0, 18.0, 19.0, 21.0, 22.0]


def test_a_layout_like_another_shares_its_links_and_forecasts_are_made_once_per_costs() -> None:
    first = _layout()
    second = _layout(like=first)
    assert second.link_pos is first.link_pos and second.source_rank is first.source_rank
    expected = CostModel.uniform(2, forward=1.0, backward=2.0, weight=0.0).expected(4, False)
    forecasts = first.forecasts(expected)
    assert first.forecasts(expected.copy()) is forecasts  # the same costs: the cached forecast
    assert first.forecasts(expected, latency=0.5) is not forecasts
    assert list(forecasts[1].expected) == [1.0, 2.0] * 4  # rank 1 alternates its forwards and backwards
