"""py-spy on the service's processes while a benchmark level runs: where each process spends its CPU.

``py-spy record --format raw`` (idle threads left out) per process; the summary is the share of one core
each process was busy, its hottest leaf functions, and its samples charged to the deepest project function
on the stack (``run (…/cli.py)`` there means the event loop and libraries outside any project coroutine), and by owner:
the leaf-most frame that is a third-party package (aiokafka, vllm, …) or a project module.
Needs ``pip install py-spy`` in the venv; without it, profiling is skipped with a note.
"""
from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

RATE = 100  # samples per second
PROJECT = ("consumers/", "producers/", "streams/", "infra/", "schemas/")


class Profiler:
    def __init__(self, pids: dict[str, int], out_dir: Path, tag: str) -> None:
        self.pids, self.out_dir, self.tag = pids, out_dir, tag
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started = 0.0
        self.cpu: dict[str, float] = {}

    def start(self) -> bool:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")  # the venv's, off PATH
        if not Path(exe).exists():
            print("   (py-spy not installed: pip install py-spy; profile skipped)")
            return False
        self.out_dir.mkdir(parents=True, exist_ok=True)
        for name, pid in self.pids.items():
            self.procs[name] = subprocess.Popen(
                [exe, "record", "--format", "raw", "--rate", str(RATE), "--nonblocking", "-p", str(pid),
                 "-o", str(self.out_dir / f"{name}-{self.tag}.txt")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.started = time.time()
        self.cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        return True

    def stop(self) -> dict[str, Any]:
        seconds = time.time() - self.started
        for proc in self.procs.values():
            proc.send_signal(signal.SIGINT)
        out: dict[str, dict[str, Any]] = {}
        for name, proc in self.procs.items():
            proc.wait(timeout=60)
            path = self.out_dir / f"{name}-{self.tag}.txt"
            out[name] = summarise(path, seconds) if path.exists() else {"error": "no output"}
            out[name]["busy_share_of_one_core"] = round((cpu_seconds(self.pids[name]) - self.cpu[name]) / seconds, 3)
        return out


def _frame(raw: str) -> tuple[str, str]:
    """'func (path/file.py:12)' -> ('func', 'path/file.py')."""
    func, _, where = raw.rpartition(" (")
    return func, where.rstrip(")").rsplit(":", 1)[0]


def _short(func: str, path: str) -> str:
    for marker in ("site-packages/", "python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{func} ({path})"


def _waiting(func: str, path: str) -> bool:
    """A leaf that is a blocking wait (uvloop's C loop shows as ``Runner.run`` with no Python frame)."""
    return func == "Runner.run" or path.startswith(("selectors.py", "threading.py", "multiprocessing/",
                                                        "queue.py", "socketserver.py"))


def _owner(frames: list[tuple[str, str]]) -> str:
    """Who the sample belongs to: the leaf-most frame that is a third-party package or project code
    (py-spy shortens paths to ``package/module.py``)."""
    for _, path in reversed(frames):
        top = path.split("site-packages/")[-1].split("/", 1)[0].removesuffix(".py")
        if any(path.startswith(m) or f"/{m}" in path for m in PROJECT):
            return path.split("/work/main/")[-1]
        if top and top not in sys.stdlib_module_names and not top.startswith("<"):
            return top
    return "stdlib (asyncio, threads)"


def summarise(path: Path, seconds: float, top: int = 8) -> dict[str, Any]:
    leaf: Counter[str] = Counter()
    project: Counter[str] = Counter()
    owner: Counter[str] = Counter()
    total = waiting = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n, frames = int(count), [_frame(f) for f in stack.split(";") if f]
        if frames and _waiting(*frames[-1]):
            waiting += n  # py-spy's idle filter misses these here: a thread blocked in poll/select/wait
            continue
        total += n
        if frames:
            leaf[_short(*frames[-1])] += n
        own = [_short(f, p) for f, p in frames if any(m in p for m in PROJECT) and "site-packages" not in p]
        project[own[-1] if own else "(outside the project)"] += n  # the deepest project function answers for it
        owner[_owner(frames)] += n
    return {"busy_samples": total, "waiting_samples": waiting, "seconds": round(seconds, 1),
            "top_leaf": [(k, round(v / total, 3)) for k, v in leaf.most_common(top)] if total else [],
            "by_owner": [(k, round(v / total, 3)) for k, v in owner.most_common(top)] if total else [],
            "by_deepest_project_frame": [(k, round(v / total, 3)) for k, v in project.most_common(top)]
            if total else []}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds used so far by these processes and all their descendants (e.g. vLLM's EngineCore)."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            continue
    return total


def cpu_probe() -> float:
    """Milliseconds a fixed slice of pure-Python work takes right now (~10 ms on an idle core of this
    machine): how much the other runs on the machine are taking from this benchmark."""
    import statistics

    times = []
    for _ in range(3):
        start = time.perf_counter()
        sum(i * i for i in range(200_000))
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 1)
