"""Find a Java 17 runtime for Kafka and Cassandra.

Cassandra 5.0 calls ``System.setSecurityManager``, which throws on Java 24+, so a newer JDK on the
machine (Temurin 25) must never be picked up by accident: only a runtime that reports major 17 counts.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import subprocess
from pathlib import Path

from infra.local.errors import JavaNotFound

WANTED_MAJOR = 17
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def parse_major(version_output: str) -> int | None:
    """The major version from ``java -version`` output (``"17.0.15"`` -> 17, ``"1.8.0_392"`` -> 8)."""
    m = _VERSION.search(version_output)
    if not m:
        return None
    major = int(m.group(1))
    if major == 1 and m.group(2):  # 1.8 style
        major = int(m.group(2))
    return major


def java_major(java: Path) -> int | None:
    try:
        out = subprocess.run([str(java), "-version"], check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_major(out.stderr + out.stdout)


def candidates(java_home: str | None = None, jvm_root: str = "/usr/lib/jvm") -> list[Path]:
    """Where to look, in order: $JAVA_HOME, then every /usr/lib/jvm/*17* install."""
    found: list[Path] = []
    if java_home:
        found.append(Path(java_home) / "bin" / "java")
    for home in sorted(glob.glob(os.path.join(jvm_root, f"*{WANTED_MAJOR}*"))):
        java = Path(home) / "bin" / "java"
        if java not in found:
            found.append(java)
    return found


@functools.lru_cache(maxsize=1)
def find_java17() -> Path:
    """The ``java`` binary of a Java 17 runtime, or :class:`JavaNotFound` saying what was tried."""
    tried: list[str] = []
    for java in candidates(os.environ.get("JAVA_HOME")):
        if not java.is_file():
            continue
        major = java_major(java)
        if major == WANTED_MAJOR:
            return java.resolve()
        tried.append(f"{java} (Java {major})")
    raise JavaNotFound(
        "no Java 17 runtime found" + (f"; tried {', '.join(tried)}" if tried else ""),
        hint="apt-get install -y openjdk-17-jdk-headless, or set JAVA_HOME to a Java 17 "
        "(Cassandra 5.0 does not run on Java 24+)",
    )


def java_home(java: Path) -> Path:
    return java.parent.parent


def has_javac(java: Path) -> bool:
    return (java_home(java) / "bin" / "javac").is_file()
