"""The faust stages' commit never passes an offset the stage did not handle."""
from __future__ import annotations

from pathlib import Path

from faust.types import TP

from infra.config.settings import Settings
from streams.app import make_app
from streams.faust_patches import HoleRefusingConsumer

TPART = TP("t.usage", 0)


def consumer(tmp_path: Path) -> HoleRefusingConsumer:
    app = make_app("usage-rollup", Settings(state_dir=tmp_path))
    assert isinstance(app.consumer, HoleRefusingConsumer)
    return app.consumer


def test_a_hole_right_after_the_committed_offset_stops_the_commit(tmp_path: Path) -> None:
    c = consumer(tmp_path)
    c._committed_offset[TPART] = 10  # the next offset to read
    c._acked[TPART] = [11, 12]  # 10 was never handled
    assert c._new_offset(TPART) is None
    c._acked[TPART].append(10)
    assert c._new_offset(TPART) == 13


def test_handled_offsets_commit_up_to_the_first_hole(tmp_path: Path) -> None:
    c = consumer(tmp_path)
    c._committed_offset[TPART] = 10
    c._acked[TPART] = [10, 11, 14]
    assert c._new_offset(TPART) == 12


async def test_a_jump_in_fetched_offsets_is_not_counted_as_handled(tmp_path: Path) -> None:
    c = consumer(tmp_path)
    c._committed_offset[TPART] = 10
    await c._add_gap(TPART, 11, 40)
    c._acked[TPART] = [41]
    assert c._new_offset(TPART) is None  # faust would have committed 42
