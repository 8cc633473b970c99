"""A bundle's tar.gz, read with every size bounded and written byte-for-byte reproducibly.

Reading (:func:`read_tarball`) takes bytes, not a path: the caller has already read them with a
size limit (a file, or an HTTP body). It refuses, naming the member: a link (symbolic or hard), a
device, a FIFO or any other non-regular member; a name that is empty, absolute beyond OPA's one
leading ``/``, has a ``..``, ``.`` or empty segment, a backslash or a control character; a member
that appears twice; more than :data:`MAX_MEMBERS` members; a member over :data:`MAX_MEMBER_BYTES`
or all of them together over :data:`MAX_TOTAL_BYTES`. Directory entries are skipped.

NOTE: OPA writes member names with a leading ``/`` (``/.manifest``, ``/data.json``) and strips it
when it verifies: names here are always without it.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib

from semgov.errors import BundleError

MAX_COMPRESSED_BYTES = 32 << 20
MAX_MEMBERS = 1000
MAX_MEMBER_BYTES = 8 << 20
MAX_TOTAL_BYTES = 64 << 20


def member_name(raw: str, *, source: str) -> str:
    """A member's name without OPA's leading ``/``; raises for any unsafe or ambiguous name."""
    name = raw[1:] if raw.startswith("/") else raw
    if name.startswith("./"):
        name = name[2:]
    bad = (
        not name
        or "\\" in name
        or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)
        or any(seg in ("", ".", "..") for seg in name.split("/"))
    )
    if bad:
        raise BundleError(f"unsafe member name {raw[:200]!r} (absolute, '..', empty segment)", source=source)
    return name


def _check_member(info: tarfile.TarInfo, name: str, total: int, *, source: str) -> None:
    if not info.isreg():
        what = "a link" if info.issym() or info.islnk() else "not a regular file"
        raise BundleError(f"{what}: bundles hold regular files only", source=source, field=name)
    if info.size > MAX_MEMBER_BYTES:
        raise BundleError(
            f"{info.size} bytes, over the {MAX_MEMBER_BYTES} bytes a member may have",
            source=source,
            field=name,
        )
    if total + info.size > MAX_TOTAL_BYTES:
        raise BundleError(f"the bundle unpacks to over {MAX_TOTAL_BYTES} bytes", source=source, field=name)


def read_tarball(data: bytes, *, source: str) -> dict[str, bytes]:
    """Every regular member of a bundle tar.gz by name (in archive order); raises
    :class:`BundleError` naming ``source`` and the member at fault."""
    if len(data) > MAX_COMPRESSED_BYTES:
        raise BundleError(
            f"{len(data)} bytes, over the {MAX_COMPRESSED_BYTES} a bundle may have", source=source
        )
    files: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|gz") as tar:
            for count, info in enumerate(tar, 1):
                if count > MAX_MEMBERS:
                    raise BundleError(f"more than {MAX_MEMBERS} members", source=source)
                if info.isdir():
                    if info.name.strip("/."):
                        member_name(info.name.rstrip("/"), source=source)
                    continue
                name = member_name(info.name, source=source)
                _check_member(info, name, total, source=source)
                if name in files:
                    raise BundleError("appears twice in the bundle", source=source, field=name)
                f = tar.extractfile(info)
                body = f.read(info.size + 1) if f is not None else b""
                if len(body) != info.size:
                    raise BundleError("truncated member", source=source, field=name)
                files[name] = body
                total += info.size
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError, OSError) as e:
        raise BundleError(f"not a readable tar.gz bundle ({e})", source=source) from e
    return files


def write_tarball(files: dict[str, bytes]) -> bytes:
    """A tar.gz of ``files`` (names as given, OPA's leading ``/`` added), reproducible: fixed
    times, owners and modes, members in the order given."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, body in files.items():
            info = tarfile.TarInfo("/" + name)
            info.size = len(body)
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(body))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return out.getvalue()


__all__ = [
    "MAX_MEMBERS",
    "MAX_MEMBER_BYTES",
    "MAX_TOTAL_BYTES",
    "member_name",
    "read_tarball",
    "write_tarball",
]
