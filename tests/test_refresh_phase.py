"""An edit that does not change the schedule keeps the schedule's phase (issue 23, item 14)."""

from __future__ import annotations

from test_running_count import T0, Stage


def test_edits_of_args_keep_an_every_s_grid_where_it_was() -> None:
    stage = Stage()
    entry = stage.write(T0)
    assert entry is not None and entry.row.next_fire == T0 + 60
    for n in range(1, 5):
        edited = stage.write(T0 + 10 * n, args={"n": n})
        assert edited is not None and edited.row.next_fire == T0 + 60


def test_an_edit_of_the_schedule_anchors_it_anew() -> None:
    stage = Stage()
    assert stage.write(T0) is not None
    edited = stage.write(T0 + 10, spec={"every_s": 30})
    assert edited is not None and edited.row.next_fire == T0 + 40


def test_an_edit_that_enables_it_again_arms_it_forward_from_now() -> None:
    stage = Stage()
    assert stage.write(T0) is not None
    assert stage.write(T0 + 10, enabled=False) is not None
    edited = stage.write(T0 + 20, enabled=True, args={"n": 1})
    assert edited is not None and edited.row.next_fire == T0 + 80
