"""Files written whole or not at all (sluice.files)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from sluice.files import atomic_path, atomic_write


def test_a_write_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "status.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["status.json"]
    atomic_write(tmp_path / "key.pem", b"k", secret=True)
    assert stat.S_IMODE((tmp_path / "key.pem").stat().st_mode) == 0o600


def test_a_failed_write_leaves_the_old_content_and_no_leftover(tmp_path: Path) -> None:
    target = tmp_path / "data.npz"
    target.write_bytes(b"complete")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        assert not tmp.name.endswith(".npz")  # no reader of *.npz takes the unfinished file
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"complete" and [p.name for p in tmp_path.iterdir()] == ["data.npz"]
