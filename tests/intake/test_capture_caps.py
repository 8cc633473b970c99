"""The live capture is bounded in size and in age, and hidden files are never read (issue 31, section 4)."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from semgov.intake.capture import MalformedLine, read_captured
from semgov.intake.capture_writer import CaptureWriter
from semgov.wire.models import CapturedRequest
from tests.conftest import ROOT

OLD_NAME = "capture-20200101T000000Z-1-000001.jsonl"


def _requests(n: int) -> list[CapturedRequest]:
    with gzip.open(ROOT / "examples" / "captured.jsonl.gz", "rb") as f:
        first = CapturedRequest.model_validate_json(f.readline())
    return [first.model_copy(update={"request_id": f"r-{i:02d}"}) for i in range(n)]


def _sizes(d: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in d.iterdir()}


def test_the_size_cap_deletes_the_oldest_files(tmp_path: Path) -> None:
    """With every line in a file of its own, the directory never holds more than max_total_bytes:
    the oldest files go first and the newest requests are kept."""
    reqs = _requests(20)
    probe = CaptureWriter(tmp_path / "probe")
    assert probe.offer(reqs[0]) and probe.flush()
    probe.close()
    line = probe.stats().bytes  # NOTE: every request is the same size (ids of two digits)
    d = tmp_path / "cap"
    w = CaptureWriter(d, max_file_bytes=line, max_total_bytes=3 * line + line // 2)
    try:
        for r in reqs:
            assert w.offer(r) and w.flush()
            assert sum(_sizes(d).values()) <= w.max_total_bytes
    finally:
        w.close()
    kept = [x for x in read_captured(d) if isinstance(x, CapturedRequest)]
    assert [x.request_id for x in kept] == ["r-17", "r-18", "r-19"]
    assert w.stats().pruned == 17


def test_the_age_cap_deletes_earlier_runs_files_and_closes_the_open_one(tmp_path: Path) -> None:
    """A capture file left by an earlier run past max_age is deleted when the writer starts (a
    recent one and files of other names are kept); the writer's own file is closed and deleted once
    its lines are that old, without further traffic."""
    old, recent, other = (
        tmp_path / OLD_NAME,
        tmp_path / OLD_NAME.replace("000001", "000002"),
        tmp_path / "notes.jsonl",
    )
    for p in (old, recent, other):
        p.write_text("{}\n")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    os.utime(other, (time.time() - 3600, time.time() - 3600))
    w = CaptureWriter(tmp_path, max_age_s=1.0)
    try:
        assert w.offer(_requests(1)[0]) and w.flush()
        deadline = time.monotonic() + 20
        while sorted(_sizes(tmp_path)) != ["notes.jsonl"]:
            assert time.monotonic() < deadline, _sizes(tmp_path)
            time.sleep(0.05)
    finally:
        w.close()
    assert w.stats().pruned == 3  # NOTE: the earlier run's two files and the writer's own


def test_the_caps_are_checked(tmp_path: Path) -> None:
    """A total cap below one file, or an age that is not positive, is refused."""
    with pytest.raises(ValueError, match="max_total_bytes"):
        CaptureWriter(tmp_path, max_file_bytes=1 << 20, max_total_bytes=1 << 10)
    with pytest.raises(ValueError, match="max_age_s"):
        CaptureWriter(tmp_path, max_age_s=0)


def test_hidden_capture_files_are_never_read(tmp_path: Path) -> None:
    """A hidden file with a capture suffix (a copy being written by a tool) is not part of the capture."""
    w = CaptureWriter(tmp_path)
    try:
        assert w.offer(_requests(1)[0]) and w.flush()
    finally:
        w.close()
    (tmp_path / ".capture-partial.jsonl").write_text('{"schema": "semgov.captured_req')
    items = list(read_captured(tmp_path))
    assert [type(x) for x in items] == [CapturedRequest] and not any(
        isinstance(x, MalformedLine) for x in items
    )
