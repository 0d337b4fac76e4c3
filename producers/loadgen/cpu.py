"""CPU seconds per service process, from ``/proc/<pid>/stat`` (utime + stime, the process and every thread),
read before and after a run and corrected by each process's idle rate measured in a quiet window first.

A named process counts with its descendants (a supervisor's child, vLLM's EngineCore), so a process
restarted under its supervisor is still counted; the parts are listed apart where they differ.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def own_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (all its threads), in seconds; raises OSError when it is gone."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 0, utime 11, stime 12
    return (int(fields[11]) + int(fields[12])) / TICKS


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return out


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p not in out:
            out.append(p)
            todo += children(p)
    return out


def tree_seconds(pid: int) -> float:
    total = 0.0
    for p in tree(pid):
        try:
            total += own_seconds(p)
        except (OSError, ValueError, IndexError):
            continue
    return total


def snapshot(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process tree."""
    return {name: tree_seconds(pid) for name, pid in pids.items()}


@dataclass(frozen=True)
class Window:
    """Each process's CPU seconds over a stretch of wall time."""

    seconds: float
    used: dict[str, float]

    def rates(self) -> dict[str, float]:
        """Cores used: CPU seconds per wall second."""
        return {n: u / self.seconds for n, u in self.used.items()} if self.seconds else {}


async def measure(pids: dict[str, int], seconds: float) -> Window:
    """A quiet window: what each process burns with nothing to do (polling, heartbeats, compaction)."""
    before, began = snapshot(pids), time.monotonic()
    await asyncio.sleep(seconds)
    return between(before, snapshot(pids), time.monotonic() - began)


def between(before: dict[str, float], after: dict[str, float], seconds: float) -> Window:
    return Window(seconds, {n: max(after[n] - b, 0.0) for n, b in before.items() if n in after})


def less_idle(run: Window, idle: Window) -> dict[str, float]:
    """CPU seconds the load added: each process's use less its idle rate over the run's length."""
    rates = idle.rates()
    return {n: max(u - rates.get(n, 0.0) * run.seconds, 0.0) for n, u in run.used.items()}
