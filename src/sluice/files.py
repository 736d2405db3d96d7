"""Files written whole or not at all: the content goes to a new file beside the target
(``<name>.<pid>.<thread>.tmp``, which no reader's pattern takes for the target, and which two threads writing
the same target at once do not share), renamed over it once complete (atomic on POSIX); a failure removes the
new file and leaves the target as it was."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A path to write ``path``'s new content to; renamed over ``path`` when the block ends without error."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, data: bytes, *, secret: bool = False) -> None:
    """Replace ``path`` by ``data`` atomically; ``secret``: the file is created owner-only (mode 0600), never
    readable by others even for a moment (keys, tokens)."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
