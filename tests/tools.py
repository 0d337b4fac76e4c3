"""Programs a test runs that pip does not install (helm, kubeconform, promtool, Prometheus, Chromium, HAProxy) and
the engine (vLLM). A test whose tool is missing fails and says how to get it; it never skips, so a run on a
machine without the tool is red, not green with fewer tests. `infra/parley test` installs every one first."""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import pytest

Test = TypeVar("Test", bound=Callable[..., Any])


def missing(tool: str, how: str) -> NoReturn:
    pytest.fail(f"{tool} is not installed and this test runs it: {how}; `infra/parley test` installs it first",
                pytrace=False)


def needs(path: object, tool: str, how: str) -> Callable[[Test], Test]:
    """A synchronous test that runs ``tool`` (found at ``path``, None when it is not): it fails without it."""
    def wrap(test: Test) -> Test:
        @functools.wraps(test)
        def run(*args: Any, **kwargs: Any) -> Any:
            if path is None:
                missing(tool, how)
            return test(*args, **kwargs)
        return run  # type: ignore[return-value]
    return wrap


def needs_engine() -> None:
    """At a module's top, before its tests: vLLM, the engine every pool runs by default."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        missing("vLLM (the engine)", "infra/parley installs it into the engine's environment")
