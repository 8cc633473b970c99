"""AuditTail: a live log's new records, read incrementally while the writer runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semgov.audit.errors import AuditLogError
from semgov.audit.frames import LOG_FILE
from semgov.audit.reader import AuditTail
from semgov.audit.store import AuditLog
from tests.audit_fixtures import KEY, ORIGIN, decisions, realization


def test_each_poll_returns_only_the_records_written_since(tmp_path: Path, keys: Any) -> None:
    """Records appear once, in order, across polls of a log that is still open for writing."""
    recs = decisions(keys, KEY, 6)
    tail = AuditTail(tmp_path)
    assert tail.poll() == []  # NOTE: no log yet
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN, commit_interval=0.0) as log:
        for r in recs[:3]:
            log.append(r).wait(10)
        first = tail.poll()
        for r in recs[3:]:
            log.append(r).wait(10)
        assert tail.poll() == [json.loads(r) for r in recs[3:]]
        assert tail.poll() == []
    assert first == [json.loads(r) for r in recs[:3]]


def test_a_frame_the_writer_has_not_finished_is_waited_for(tmp_path: Path, keys: Any) -> None:
    """A partly written last frame is not an error: the next poll, once it is whole, returns it."""
    recs = decisions(keys, KEY, 2)
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN, commit_interval=0.0) as log:
        log.append(recs[0]).wait(10)
    whole = (tmp_path / LOG_FILE).read_bytes()
    tail = AuditTail(tmp_path)
    (tmp_path / LOG_FILE).write_bytes(whole[:40])
    assert tail.poll() == []
    (tmp_path / LOG_FILE).write_bytes(whole)
    assert tail.poll()[0] == json.loads(recs[0])


def test_a_damaged_new_frame_and_a_shrunk_log_are_errors(tmp_path: Path, keys: Any) -> None:
    """A changed byte in a durable frame not yet read, or a log shorter than what was read, raises."""
    recs = decisions(keys, KEY, 3)
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN, commit_interval=0.0) as log:
        for r in recs:
            log.append(r).wait(10)
        log.append(realization(recs[1], KEY)).wait(10)
    data = bytearray((tmp_path / LOG_FILE).read_bytes())
    tail = AuditTail(tmp_path)
    assert len(tail.poll()) == 4
    tail2 = AuditTail(tmp_path)
    data[60] ^= 1
    (tmp_path / LOG_FILE).write_bytes(bytes(data))
    with pytest.raises(AuditLogError):
        tail2.poll()
    (tmp_path / LOG_FILE).write_bytes(bytes(data[:100]))
    with pytest.raises(AuditLogError, match="shorter than"):
        tail.poll()
