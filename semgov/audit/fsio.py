"""File-durability helpers of the audit log.

Whole writes, fsynced temp files, atomic replaces, files written once, and directory
descriptors (to fsync a directory after a rename or a create).

Every helper fsyncs what it wrote before it returns; callers fsync the directory (or use a
helper that does) for a new or renamed name to survive a crash.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

#: Bytes read at a time when re-reading or copying records.log.
READ_CHUNK: Final = 1 << 20


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte of ``data`` is written (a write may be partial)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def durable_temp(directory: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to ``directory/.name.tmp`` and fsync it; return its path."""
    tmp = directory / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def atomic_replace(dir_fd: int, directory: Path, name: str, data: bytes) -> None:
    """Replace ``directory/name`` with ``data``: temp file, fsync, rename, fsync directory."""
    os.replace(durable_temp(directory, name, data), directory / name)
    os.fsync(dir_fd)


def write_once(dir_fd: int, directory: Path, name: str, data: bytes) -> bytes | None:
    """Create ``directory/name`` with ``data`` unless it exists; return the existing bytes if so."""
    final = directory / name
    tmp = durable_temp(directory, name, data)
    try:
        os.link(tmp, final)
    except FileExistsError:
        return final.read_bytes()
    finally:
        os.unlink(tmp)
    os.fsync(dir_fd)
    return None


def open_dir(path: Path) -> int:
    """A read-only descriptor of the directory ``path`` (to fsync it)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)
