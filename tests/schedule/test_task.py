import pytest

from hintpipe.schedule.task import B, F, Kind, Task, W


def test_text_form_matches_torch_action_strings() -> None:
    assert str(Task(2, Kind.F, 0)) == "2F0"
    assert str(B(13, 7)) == "13B7"
    assert str(W(1, 2)) == "1W2"


def test_parse_round_trips() -> None:
    for task in (F(0, 0), B(3, 12), W(10, 5)):
        assert Task.parse(str(task)) == task


@pytest.mark.parametrize("text", ["", "F0", "2X0", "2F", "-1F0", "2F0x"])
def test_parse_refuses_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match=r"bad task .*expected <stage><F\|B\|W><micro-batch>, e.g. '2F0'"):
        Task.parse(text)
