"""Resolve a service's jars from Maven Central into ``<cache_dir>/<name>-<version>/lib``.

The POMs in infra/kafka and infra/cassandra only list dependencies; ``dependency:copy-dependencies``
copies the resolved runtime classpath into a fresh folder, which is renamed into place once complete,
so an interrupted download is simply redone.  The local Maven repository is ``<cache_dir>/m2``.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import deque
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from infra.local.errors import DownloadFailed

DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
_DOWNLOADED = re.compile(r"Downloaded from \S+: (\S+) \((\d+(?:\.\d+)?) (B|kB|MB|GB)")
_BOILERPLATE = re.compile(r"Re-run Maven|For more information|\[Help \d+\] http|^\[ERROR\] *$")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def pom_property(pom: Path, name: str) -> str:
    """A ``<properties>`` entry of ``pom`` (the POMs keep each service's version there)."""
    root = ET.parse(pom).getroot()
    node = root.find(f"m:properties/m:{name}", _NS)
    if node is None or not (node.text or "").strip():
        raise ValueError(f"{pom} has no <properties><{name}>")
    return (node.text or "").strip()


def lib_dir(cache_dir: Path, name: str, version: str) -> Path:
    return cache_dir / f"{name}-{version}" / "lib"


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:16]


def is_complete(lib: Path, pom: Path) -> bool:
    stamp = lib.parent / ".complete"
    try:
        return lib.is_dir() and stamp.read_text().strip() == _pom_digest(pom)
    except OSError:
        return False


def parse_download(line: str) -> tuple[str, int] | None:
    """``(artifact file name, bytes)`` from a Maven 'Downloaded from' line, else None."""
    m = _DOWNLOADED.search(line)
    if not m:
        return None
    return m.group(1).rsplit("/", 1)[-1], int(float(m.group(2)) * _UNITS[m.group(3)])


def ensure_libs(
    name: str,
    pom: Path,
    cache_dir: Path,
    *,
    java_home: Path | None = None,
    console: Console | None = None,
) -> Path:
    """The folder holding ``name``'s runtime jars, downloading them the first time."""
    version = pom_property(pom, f"{name}.version")
    lib = lib_dir(cache_dir, name, version)
    if is_complete(lib, pom):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DownloadFailed(
            f"Maven (mvn) is needed once to download {name} {version} and is not on PATH",
            hint="apt-get install -y maven",
        )
    partial = lib.parent / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [
        mvn,
        "-B",
        "-f",
        str(pom),
        f"-Dmaven.repo.local={cache_dir / 'm2'}",
        f"{DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={partial}",
    ]
    rc, last = _run_maven(cmd, pom, f"{name} {version}", java_home, console)
    if rc != 0:
        errors = [ln for ln in last if ln.startswith("[ERROR] ") and not _BOILERPLATE.search(ln)][-12:]
        errors = errors or list(last)[-12:]
        raise DownloadFailed(
            f"Maven could not resolve {name} {version} (mvn exit {rc})",
            hint="check that Maven Central (or the mirror in ~/.m2/settings.xml) is reachable, then rerun "
            f"`parley up`; the command was: {' '.join(cmd)}",
            log_tail="\n".join(errors),
        )
    shutil.rmtree(lib, ignore_errors=True)
    os.replace(partial, lib)
    (lib.parent / ".complete").write_text(_pom_digest(pom) + "\n")
    return lib


def _run_maven(
    cmd: list[str], pom: Path, label: str, java_home: Path | None, console: Console | None
) -> tuple[int, deque[str]]:
    """Maven's exit code and its last 60 lines, each jar it downloads shown on ``console`` meanwhile."""
    env = dict(os.environ)
    if java_home is not None:
        env["JAVA_HOME"] = str(java_home)
    last: deque[str] = deque(maxlen=60)
    files, size = 0, 0
    progress = _progress(console)
    try:
        if progress is not None:
            progress.start()
            task = progress.add_task(f"{label}: resolving jars", detail="", total=None)
        try:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=pom.parent
            )
        except OSError as exc:
            raise DownloadFailed(f"could not run {cmd[0]}: {exc}", hint="apt-get install -y maven") from exc
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            last.append(line)
            got = parse_download(line)
            if got and progress is not None:
                files, size = files + 1, size + got[1]
                progress.update(task, detail=f"{files} files, {size / 1e6:.1f} MB - {got[0]}")
        rc = proc.wait()
        if progress is not None:
            progress.update(
                task,
                description=f"{label}: jars {'ready' if rc == 0 else 'FAILED'}",
                detail=f"{files} files, {size / 1e6:.1f} MB downloaded",
            )
    finally:
        if progress is not None:
            progress.stop()
    return rc, last


def _progress(console: Console | None) -> Progress | None:
    if console is None:
        return None
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
