"""Files that readers and other writers may look at while they change: atomic writes (temp file + fsync + rename) and
JSON-lines records whose lines are replaced under a lock."""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


@contextmanager
def atomic_write(path: str | Path) -> Iterator[BinaryIO]:
    """A binary file that becomes ``path`` when the block ends without an error: a reader sees the old file or the
    new one, never a partial one (an error leaves the old file and no temp file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # the temp file lies beside the target: os.replace is atomic only within one file system
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make the file unreadable to the user's group
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_write(path) as f:
        f.write(text.encode())
    return Path(path)


def read_jsonl(path: str | Path) -> list:
    """The values of a JSON-lines file, one per non-blank line; ValueError naming the file and line of one that is
    not JSON."""
    values = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not JSON ({exc})") from None
    return values


def replace_jsonl_line(path: str | Path, record: dict, key: str) -> Path:
    """Put ``record`` into the JSON-lines file ``path`` (a mapping a line): in place of the line whose ``key`` equals
    the record's, or else at the end; the other lines keep their order.

    Writers of other records of the same file may finish at the same time: an exclusive ``flock`` on the sidecar
    ``<path>.lock`` serialises the read-modify-write (a lock on ``path`` itself would not survive its replacement), and
    the atomic write keeps lock-free readers from seeing a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the lock file closes
        records = read_jsonl(path) if path.exists() else []
        at = next((i for i, old in enumerate(records) if old.get(key) == record[key]), len(records))
        records[at:at + 1] = [record]
        return atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in records))
