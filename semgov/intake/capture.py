"""Reading captured-traffic JSON Lines (plain or gzip), one request per line.

A malformed line never stops the rest: it is reported with its line number and,
when enough of it parses to know which donors were asked about, those donors
still get a (deny) decision.

Strict JSON only: a line with a duplicate object key (anywhere) or a ``NaN`` /
``Infinity`` literal is malformed, because other readers of the same bytes could
see different values. A line over :class:`~semgov.intake.limits.Limits` ``max_line_bytes``
is malformed too, and is never read whole: only its first ``max_line_bytes`` are kept,
to name the request and the donors it asked about.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from semgov.errors import InputError
from semgov.intake.limits import MAX_ID_CHARS, Limits, resolve
from semgov.wire.models import CapturedRequest

# The default (setting: SEMGOV_MAX_LINE_BYTES, semgov check --max-line-bytes).
MAX_LINE_BYTES = Limits().max_line_bytes
_SKIP_CHUNK = 1 << 20
# The files a capture directory is read from (semgov.intake.capture_writer writes *.jsonl).
CAPTURE_SUFFIXES = (".jsonl", ".jsonl.gz")


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A line that is not a valid captured request."""

    line: int
    reason: str
    request_id: str | None
    tenant: str
    namespace: str
    donor_ids: tuple[str, ...]


_AT = re.compile(r" at line (\d+) column (\d+)$")


def _describe(e: ValidationError, raw: bytes = b"") -> str:
    errs = e.errors(include_url=False)
    first = errs[0]
    loc = ".".join(str(p) for p in first["loc"])
    msg = f"{loc}: {first['msg']}" if loc else first["msg"]
    m = _AT.search(msg) if first["type"] == "json_invalid" else None
    if m is not None:
        # NOTE: the JSON parser counts lines inside the one captured line (its newline makes a
        # "line 2"): say where in the captured line instead.
        end = int(m.group(1)) > 1 or int(m.group(2)) >= len(raw.rstrip(b"\r\n"))
        where = " at the end of the line (the line is cut short?)" if end else f" at column {m.group(2)}"
        msg = msg[: m.start()] + where
    if len(errs) > 1:
        msg += f" (+{len(errs) - 1} more)"
    return msg


def _id(v: object) -> str | None:
    """``v`` when it could be a valid id (a string of 1..512 characters, valid UTF-8), else None.

    NOTE: salvaged ids go into signed deny records, which must be canonical UTF-8 JSON.
    """
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_ID_CHARS:
        return None
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return v


def _salvage_doc(doc: object, line: int, reason: str) -> MalformedLine:
    rid: str | None = None
    tenant = namespace = ""
    donors: list[str] = []
    if isinstance(doc, dict):
        rid = _id(doc.get("request_id"))
        tenant = _id(doc.get("tenant")) or ""
        namespace = _id(doc.get("namespace")) or ""
        cands = doc.get("candidates")
        if rid is not None and isinstance(cands, list):
            for c in cands:
                d = _id(c.get("donor_id")) if isinstance(c, dict) else None
                if d is not None and d not in donors:
                    donors.append(d)
    return MalformedLine(line, reason, rid, tenant, namespace, tuple(donors))


def _salvage(raw: bytes, line: int, reason: str) -> MalformedLine:
    """Recover request id and donor ids from a malformed line, when they are there."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        doc = None
    return _salvage_doc(doc, line, reason)


# ---- a cut-off line: what its first bytes tell ---------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Cut(Exception):
    """The text ends (or goes wrong) before the value does."""


def _skip(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def _partial(text: str, i: int, levels: int) -> tuple[Any, int]:
    """The JSON value at ``i`` and where it ends; objects and arrays within ``levels`` levels
    are kept as far as they go: :class:`_Cut` carries what was read when the text ends inside.
    """
    i = _skip(text, i)
    opener = text[i : i + 1]
    if levels <= 0 or opener not in ("{", "["):
        try:
            value, end = _DECODER.raw_decode(text, i)
        except (ValueError, RecursionError) as e:
            raise _Cut(None) from e
        return value, end
    is_obj = opener == "{"
    out: Any = {} if is_obj else []
    closer = "}" if is_obj else "]"
    i = _skip(text, i + 1)
    if text[i : i + 1] == closer:
        return out, i + 1
    while True:
        key: object = None
        try:
            if is_obj:
                key, i = _DECODER.raw_decode(text, i)
                i = _skip(text, i)
                if not isinstance(key, str) or text[i : i + 1] != ":":
                    raise _Cut(None)
                i += 1
            value, i = _partial(text, i, levels - 1)
        except _Cut as cut:
            if cut.args[0] is not None:
                if not is_obj:
                    out.append(cut.args[0])
                elif isinstance(key, str):
                    out[key] = cut.args[0]
            raise _Cut(out) from None
        except (ValueError, RecursionError):
            raise _Cut(out) from None
        if is_obj:
            out[key] = value
        else:
            out.append(value)
        i = _skip(text, i)
        sep = text[i : i + 1]
        if sep == closer:
            return out, i + 1
        if sep != ",":
            raise _Cut(out)
        i = _skip(text, i + 1)


def _salvage_prefix(prefix: bytes, line: int, reason: str) -> MalformedLine:
    """Request id and donor ids from the first bytes of an over-long line (those it reaches)."""
    text = prefix.decode("utf-8", "ignore")
    try:
        doc: Any = _partial(text, 0, 3)[0]  # request -> candidates -> candidate
    except _Cut as cut:
        doc = cut.args[0]
    except RecursionError:
        doc = None
    return _salvage_doc(doc, line, reason)


# ---- strictness ---------------------------------------------------------------------------------

# NOTE: the duplicate-key pass skips the digits of token id arrays: a `"token_ids":` whose
# closing quote is unescaped ends a string, so the `[...]` after it is a structural array of
# digits, and emptying it changes no object's keys. It halves the pass on real traffic.
_TOKEN_ARRAY = re.compile(rb'"token_ids"\s*:\s*\[[0-9,\s]*\]')


class _NotStrict(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _NotStrict(f"duplicate key {k!r}: a JSON object may not repeat a key")
            seen.add(k)
    return out


def _no_constant(name: str) -> Any:
    raise _NotStrict(f"{name} is not JSON: numbers must be finite")


def strictness_problem(raw: bytes) -> str | None:
    """Why a line that parsed is still not strict JSON (duplicate key, NaN/Infinity), if it is not."""
    try:
        json.loads(
            _TOKEN_ARRAY.sub(b'"token_ids":[]', raw),
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
        )
    except _NotStrict as e:
        return str(e)
    except (ValueError, RecursionError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def parse_line(raw: bytes, line: int, *, limits: Limits | None = None) -> CapturedRequest | MalformedLine:
    """Parse one JSONL line; never raises for bad content.

    ``limits`` (default: :meth:`Limits.from_env`) gives ``max_line_bytes`` (newline excluded).
    """
    lim = resolve(limits)
    size = len(raw) - (1 if raw.endswith(b"\n") else 0)
    if size > lim.max_line_bytes:
        return _salvage_prefix(raw[: lim.max_line_bytes], line, _too_long(size, lim))
    try:
        req = CapturedRequest.model_validate_json(raw)
    except ValidationError as e:
        return _salvage(raw, line, _describe(e, raw))
    except (ValueError, RecursionError) as e:
        return _salvage(raw, line, f"{type(e).__name__}: {e}")
    problem = strictness_problem(raw)
    if problem is not None:
        return _salvage(raw, line, problem)
    return req


def _too_long(size: int | None, lim: Limits) -> str:
    how_long = f"{size} bytes" if size is not None else f"over {lim.max_line_bytes} bytes"
    return f"line is {how_long}, over the limit ({lim.describe('max_line_bytes')})"


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    try:
        f: IO[bytes] = open(path, "rb")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror}", source=path) from e
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=f)  # type: ignore[return-value]
    return f


def _lines(f: IO[bytes], limit: int) -> Iterator[tuple[bytes, int | None]]:
    """``(line, None)`` for each line within ``limit`` bytes (newline excluded); for a longer one,
    ``(its first limit + 1 bytes, its length)``, the rest read in chunks and dropped."""
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield raw, None
            continue
        size = len(raw)
        while True:
            chunk = f.readline(_SKIP_CHUNK)
            if not chunk:
                break
            if chunk.endswith(b"\n"):
                size += len(chunk) - 1
                break
            size += len(chunk)
        yield raw, size


def _read_file(
    f: IO[bytes], lim: Limits, first: int = 0, label: str | None = None
) -> Generator[tuple[int, CapturedRequest | MalformedLine], None, int]:
    """``(line in this file, item)`` for each item of one open file, numbered from ``first + 1``
    (``item.line`` of a MalformedLine); returns the last line number. A read error ends the file
    with one MalformedLine ("cannot read further"). With a ``label``, each malformed line's reason
    starts with ``"{label} line {n}: "`` (``n`` counted in this file)."""
    n = first
    try:
        for raw, over in _lines(f, lim.max_line_bytes):
            n += 1
            if over is not None:
                item: CapturedRequest | MalformedLine = _salvage_prefix(
                    raw[: lim.max_line_bytes], n, _too_long(over, lim)
                )
            elif raw.strip():
                item = parse_line(raw, n, limits=lim)
            else:
                continue
            yield n - first, _labelled(item, label, n - first)
    except (OSError, EOFError, gzip.BadGzipFile, io.UnsupportedOperation) as e:
        n += 1
        end = MalformedLine(n, f"cannot read further: {e}", None, "", "", ())
        yield n - first, _labelled(end, label, n - first)
    return n


def _labelled(
    item: CapturedRequest | MalformedLine, label: str | None, n: int
) -> CapturedRequest | MalformedLine:
    if label is None or not isinstance(item, MalformedLine):
        return item
    return replace(item, reason=f"{label} line {n}: {item.reason}")


def capture_files(directory: str | Path) -> list[Path]:
    """A capture directory's ``*.jsonl`` and ``*.jsonl.gz`` files, in name order (:class:`InputError`
    when it has none or cannot be listed); hidden ones (a name starting with ``.``) are never read."""
    d = Path(directory)
    try:
        files = sorted(
            (
                p
                for p in d.iterdir()
                if p.name.endswith(CAPTURE_SUFFIXES) and not p.name.startswith(".") and p.is_file()
            ),
            key=lambda p: p.name,
        )
    except OSError as e:
        raise InputError(f"cannot list: {e.strerror}", source=str(d)) from e
    if not files:
        raise InputError(f"no capture files ({', '.join('*' + s for s in CAPTURE_SUFFIXES)}) in {d}")
    return files


def _read_directory(
    directory: str | Path, lim: Limits
) -> Iterator[tuple[str, int, CapturedRequest | MalformedLine]]:
    """Every capture file of ``directory`` as one stream (line numbers count across the files)."""
    offset = 0
    for path in capture_files(directory):
        f = _open(str(path))
        try:
            items = _read_file(f, lim, offset, path.name)
            while True:
                try:
                    n, item = next(items)
                except StopIteration as stop:
                    offset = stop.value
                    break
                yield str(path), n, item
        finally:
            f.close()


def read_captured(
    path: str | Path, *, limits: Limits | None = None
) -> Iterator[CapturedRequest | MalformedLine]:
    """Yield each non-blank line of a captured JSONL file (``-`` for stdin, ``.gz`` ok).

    A directory is read as one stream: its ``*.jsonl`` and ``*.jsonl.gz`` files in name order
    (what :class:`~semgov.intake.capture_writer.CaptureWriter` writes), line numbers counting
    across the files, each :class:`MalformedLine` reason starting with ``"{file name} line {n}: "``;
    a directory without such a file is an :class:`InputError`.

    ``limits`` (default: :meth:`Limits.from_env`): a line over ``max_line_bytes`` is a
    :class:`MalformedLine` and is never held in memory beyond that many bytes.
    """
    for _, _, item in read_captured_at(path, limits=limits):
        yield item


def read_captured_at(
    path: str | Path, *, limits: Limits | None = None
) -> Iterator[tuple[str, int, CapturedRequest | MalformedLine]]:
    """:func:`read_captured`, each item with where it was read: ``(file, line in that file, item)``
    (in a capture directory: the file of the directory and its own line number)."""
    lim = resolve(limits)
    name = str(path)
    if name != "-" and Path(name).is_dir():
        yield from _read_directory(name, lim)
        return
    f = _open(name)
    try:
        for n, item in _read_file(f, lim):
            yield name, n, item
    finally:
        if f is not sys.stdin.buffer:
            f.close()
