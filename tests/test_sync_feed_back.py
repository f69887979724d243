"""A change feed that goes back behind the mirror's cursor (another server, one restored from
a backup, a proxy that answers an old head): noted once, with one read of every record, and
followed from its new head; a feed that keeps going back costs no line and no full read a
poll. Pure pieces: the sync stage fed pages by hand."""

from __future__ import annotations

import logging

import pytest
from test_sync_slices import change, following

from anyrtd.client import ChangePage


def test_a_feed_that_keeps_going_back_is_noted_once_and_read_whole_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sync, _ = following(500)
    assert not sync.full_read_due(1000.0, 300.0)
    caplog.set_level(logging.WARNING)
    sync.take(ChangePage([change(3, "t")], 4), 1000.0)
    assert sync.cursor == 4 and sync.full_read_due(1000.0, 300.0)
    sync._last_full = 1000.0  # as the full read it asked for sets it
    for poll, head in enumerate([3, 2, 2, 1]):  # a feed answering ever older heads
        sync.take(ChangePage([], head), 1001.0 + poll)
        assert sync.cursor == head
        assert not sync.full_read_due(1001.0 + poll, 300.0)
    assert len([r for r in caplog.records if "behind the mirror's cursor" in r.message]) == 1


def test_a_feed_that_goes_back_again_after_moving_forward_is_noted_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sync, _ = following(500)
    sync.full_read_due(1000.0, 300.0)
    caplog.set_level(logging.WARNING)
    sync.take(ChangePage([], 4), 1000.0)
    sync._last_full = 1000.0
    sync.take(ChangePage([change(5, "t")], 5), 1001.0)  # forward: the episode is over
    sync.take(ChangePage([], 5), 1002.0)  # a long poll with nothing new: neither
    assert not sync.full_read_due(1002.0, 300.0)
    sync.take(ChangePage([], 2), 1003.0)  # restored again
    assert sync.cursor == 2 and sync.full_read_due(1003.0, 300.0)
    assert len([r for r in caplog.records if "behind the mirror's cursor" in r.message]) == 2


def test_a_feed_repeating_what_was_read_is_backed_off_until_a_page_moves_forward() -> None:
    from anyrtd.sync import FEED_BACKOFF_FIRST_S, FEED_BACKOFF_MAX_S

    sync, _ = following(500)
    sync.take(ChangePage([change(501, "t")], 501), 1000.0)
    assert sync.feed_backoff_s == 0.0
    waits = []
    for poll in range(8):  # the same entry again, at the same head
        sync.take(ChangePage([change(501, "t")], 501), 1001.0 + poll)
        waits.append(sync.feed_backoff_s)
    assert waits[0] == FEED_BACKOFF_FIRST_S and waits[-1] == FEED_BACKOFF_MAX_S
    assert waits == sorted(waits)
    sync.take(ChangePage([change(502, "t")], 502), 1010.0)
    assert sync.feed_backoff_s == 0.0
