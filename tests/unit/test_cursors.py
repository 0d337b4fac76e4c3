"""Signed page cursors and the Unicode check, without any store."""
from __future__ import annotations

from pathlib import Path

import pytest

from infra.config.settings import Settings
from producers.gateway.cursors import Cursors, cursor_key
from producers.gateway.errors import ApiError
from producers.gateway.openai_compat import CompatError, parse
from producers.gateway.text import first_non_unicode, is_unicode


def test_a_signed_cursor_opens_only_for_its_own_list() -> None:
    cursors = Cursors(b"k" * 32)
    cursor = cursors.sign("conversations:u1", "AAEC-paging")
    assert cursor is not None and cursors.open("conversations:u1", cursor) == "AAEC-paging"
    with pytest.raises(ApiError) as other_list:
        cursors.open("conversations:u2", cursor)
    assert other_list.value.status == 400 and other_list.value.code == "bad_cursor"
    assert cursors.sign("conversations:u1", None) is None and cursors.open("x", None) is None


@pytest.mark.parametrize("bad", ["null", "AAAA", ".", "AAAA.", "é.é", "AAAA.AAAAAAAAAAAAAAAAAAAAAA", "x" * 3000])
def test_anything_not_signed_here_is_400(bad: str) -> None:
    with pytest.raises(ApiError) as err:
        Cursors(b"k" * 32).open("conversations:u1", bad)
    assert err.value.status == 400


def test_a_cursor_from_another_key_is_refused_and_the_local_key_is_shared(tmp_path: Path) -> None:
    settings = Settings().with_(state_dir=tmp_path)
    key = cursor_key(settings)
    assert len(key) == 32 and cursor_key(settings) == key and (tmp_path / "cursor.key").stat().st_mode & 0o077 == 0
    forged = Cursors(b"other-key").sign("s", "state")
    with pytest.raises(ApiError):
        Cursors(key).open("s", forged)
    assert cursor_key(settings.with_(cursor_secret="from-env")) == b"from-env"


def test_lone_surrogates_are_found_wherever_they_are() -> None:
    assert is_unicode("café 😀") and not is_unicode("\ud800")
    assert first_non_unicode({"a": [1, {"b": "ok"}, {"c": "x\udfff"}]}) == "a[2].c"
    assert first_non_unicode({"k\ud800": 1}) == "body" and first_non_unicode({"a": "fine"}) is None
    # an integer past 64 bits fails the fast pass; the walk still finds the surrogate, or nothing
    assert first_non_unicode({"n": 1 << 70, "a": ["\ud800"]}) == "a[0]"
    assert first_non_unicode({"n": 1 << 70, "a": ["fine"]}) is None


def test_the_openai_route_refuses_a_surrogate_with_422_naming_the_param() -> None:
    body = {"model": "large", "messages": [{"role": "user", "content": "\ud800"}]}
    with pytest.raises(CompatError) as err:
        parse(body, {"large": "m"}, "large", 1000)
    assert err.value.status == 422 and err.value.param == "messages[0].content"
