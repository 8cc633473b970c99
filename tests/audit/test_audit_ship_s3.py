"""Shipping over the S3 protocol to a real S3 server process (moto's server on localhost): written
once with `If-None-Match: *`, and a store that stops answering loses nothing and is caught up.

moto's server speaks the S3 REST API over HTTP as AWS does (conditional writes included); boto3
talks to it exactly as to AWS, MinIO or Ceph RGW through ``--endpoint-url``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from semgov.audit.frames import LOG_FILE
from semgov.audit.ship import Range, ShipError, log_prefix, range_key
from semgov.audit.shipper import fetch, ship_follow, ship_once
from semgov.audit.store import AuditLog
from semgov.audit.stores import S3Store, StoreUnavailable, open_store
from semgov.audit.verify_dir import verify_log
from tests.audit.test_audit_ship import sealed_prefix
from tests.audit_fixtures import KEY, ORIGIN, PUB, decisions, write_log

BUCKET = "semgov-audit"


def _free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real S3 server process on localhost (moto's), with one bucket; its URL and process."""
    if os.environ.get("CI") is None:
        pytest.importorskip("moto.server")
        pytest.importorskip("boto3")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "moto's S3 server did not start"
            time.sleep(0.2)
    try:
        yield url, proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def s3(s3_server: tuple[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> S3Store:
    """A store on a fresh prefix of the bucket, with test credentials and short timeouts."""
    for k, v in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("semgov.audit.stores.S3_CONNECT_TIMEOUT_S", 1.0)
    monkeypatch.setattr("semgov.audit.stores.S3_READ_TIMEOUT_S", 1.0)
    store, _ = open_store(f"s3://{BUCKET}", endpoint_url=s3_server[0])
    assert isinstance(store, S3Store)
    try:
        store.client.create_bucket(Bucket=BUCKET)
    except store.client.exceptions.BucketAlreadyOwnedByYou:
        pass
    return store


def test_a_log_ships_to_s3_and_fetches_back_verified(tmp_path: Path, keys: Any, s3: S3Store) -> None:
    """Over the S3 protocol: the fetched log equals the sealed log and verifies; a rerun sends nothing."""
    log = tmp_path / "w1"
    write_log(log, decisions(keys, KEY, 5))
    done = ship_once(log, s3, "t1", limit=1)
    assert done.ranges == 5 and done.end.size == 5
    assert ship_once(log, s3, "t1").ranges == 0
    fetch(s3, "t1", ORIGIN, tmp_path / "copy")
    assert (tmp_path / "copy" / LOG_FILE).read_bytes() == sealed_prefix(log)
    assert verify_log(tmp_path / "copy", public_key=PUB, workers=1).ok


def test_s3_refuses_a_second_write_of_a_key(tmp_path: Path, keys: Any, s3: S3Store) -> None:
    """The store keeps the first bytes of a key; shipping other bytes there is a named conflict."""
    log = tmp_path / "w1"
    write_log(log, decisions(keys, KEY, 2))
    key = range_key("t2", ORIGIN, Range(0, len(sealed_prefix(log)), 2))
    assert s3.put_once(key, b"first") is None
    assert s3.put_once(key, b"second") == b"first"
    with pytest.raises(ShipError, match="already holds other bytes") as e:
        ship_once(log, s3, "t2")
    assert "s3://semgov-audit/" in e.value.diagnostic() and key in e.value.diagnostic()


def test_a_store_that_stops_answering_is_caught_up_in_order(
    tmp_path: Path, keys: Any, s3: S3Store, s3_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    """The S3 server is frozen while the worker keeps writing: the shipper retries, the local log
    keeps every record, and once the server answers the store's copy is the whole sealed log."""
    log = tmp_path / "w1"
    recs = decisions(keys, KEY, 12)
    stop = threading.Event()
    errors: list[BaseException] = []
    unreachable: list[StoreUnavailable] = []

    class Watched(S3Store):
        """The same store, counting the calls that found it unreachable."""

        def list(self, prefix: str) -> list[str]:
            try:
                return super().list(prefix)
            except StoreUnavailable as e:
                unreachable.append(e)
                raise

    watched = Watched(s3.bucket, s3.client)

    def follow() -> None:
        try:
            ship_follow(log, watched, "t3", interval_s=0.1, max_backoff_s=0.5, stop=stop.is_set)
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    with AuditLog.open(log, signing_key=KEY, origin=ORIGIN, commit_interval=0.0) as writer:
        writer.append(recs[0]).wait(10)
        shipper = threading.Thread(target=follow, daemon=True)
        shipper.start()
        _until(lambda: _shipped_size(s3, "t3") >= 1)
        os.killpg(s3_server[1].pid, signal.SIGSTOP)  # the store stops answering
        try:
            for r in recs[1:]:
                writer.append(r).wait(10)
            _until(lambda: len(unreachable) >= 2)  # passes time out against the frozen server
            assert _local_records(log) == 12
        finally:
            os.killpg(s3_server[1].pid, signal.SIGCONT)
        _until(lambda: _shipped_size(s3, "t3") == 12)
    stop.set()
    shipper.join(10)
    assert not errors, errors
    ship_once(log, s3, "t3")  # after the writer's final checkpoint
    fetch(s3, "t3", ORIGIN, tmp_path / "copy")
    assert (tmp_path / "copy" / LOG_FILE).read_bytes() == sealed_prefix(log)
    assert verify_log(tmp_path / "copy", public_key=PUB, workers=1).ok


def _shipped_size(s3: S3Store, prefix: str) -> int:
    """Records the store's copy holds (0 while it cannot be listed)."""
    from semgov.audit.ship import shipped_cursor

    try:
        return shipped_cursor(s3.list(log_prefix(prefix, ORIGIN) + "records/"), "s3").size
    except StoreUnavailable:
        return 0


def _local_records(log: Path) -> int:
    """Records in the local log (every one sealed by now)."""
    from semgov.audit.reader import iter_records

    return sum(1 for _ in iter_records(log))


def _until(cond: Any, timeout: float = 60.0) -> None:
    """Wait until ``cond()`` holds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
