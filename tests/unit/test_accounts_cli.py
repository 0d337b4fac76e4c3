"""``parley user create`` with Cassandra down or too slow: one line on stderr and exit 3, no traceback."""
from __future__ import annotations

import argparse
from typing import Any

import pytest
from cassandra import OperationTimedOut, WriteTimeout
from cassandra.cluster import NoHostAvailable

from infra.stores import accounts_cli

ARGS = argparse.Namespace(action="create", plan="free", name=None)


@pytest.mark.parametrize(("error", "says"), [
    (NoHostAvailable("Unable to connect to any servers", {"127.0.0.1:9042": ConnectionRefusedError()}),
     "cannot reach Cassandra at "),
    (OperationTimedOut("errors={}, last_host=127.0.0.1:9042"), "did not answer in time (OperationTimedOut)"),
    (WriteTimeout("Operation timed out", write_type=0), "did not answer in time (WriteTimeout)"),
])
def test_cassandra_down_or_slow_is_one_line_and_exit_3(monkeypatch: pytest.MonkeyPatch, capsys: Any,
                                                       error: Exception, says: str) -> None:
    async def failing(*_: Any) -> Any:
        raise error

    monkeypatch.setattr(accounts_cli, "_create", failing)
    assert accounts_cli.run(ARGS) == 3
    out, err = capsys.readouterr()
    assert out == ""  # nothing that looks like a token or a user id
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("parley user create: ") and says in lines[0], err
    assert "`parley status`" in lines[0] and "Traceback" not in err


def test_any_other_error_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*_: Any) -> Any:
        raise ValueError("a defect, not an outage")

    monkeypatch.setattr(accounts_cli, "_create", broken)
    with pytest.raises(ValueError):
        accounts_cli.run(ARGS)
