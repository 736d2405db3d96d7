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


def test_threads_writing_the_same_file_at_once_all_succeed(tmp_path: Path) -> None:
    """A run's status is written from its training loop and from its state changes: each writer has its own
    new file, so no write removes another's or renames it away."""
    import threading

    target = tmp_path / "status.json"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def write(i: int) -> None:
        start.wait()
        try:
            for _ in range(200):
                atomic_write(target, f"writer {i}".encode() * 100)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes().startswith(b"writer ") and [p.name for p in tmp_path.iterdir()] == ["status.json"]
