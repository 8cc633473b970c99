"""Shipping a worker's log to a store and back (issue 36, "Shipping records off the worker"):
only sealed bytes, in order, each object written once, and a copy `semgov audit verify` checks.

The store here is a directory (:class:`semgov.audit.stores.DirStore`); the S3 protocol against a
real S3 server process is in ``test_audit_ship_s3.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from semgov.audit.frames import LOG_FILE
from semgov.audit.ship import Range, ShipError, log_prefix, next_range, range_key, shipped_cursor
from semgov.audit.shipper import fetch, ship_once, stored_logs
from semgov.audit.stores import DirStore
from semgov.audit.verify_dir import verify_log
from semgov.cli.main import main
from tests.audit_fixtures import KEY, ORIGIN, PUB, PUB_PEM, decisions, split_frames, write_log

SEAL = 1 << 63


def sealed_prefix(d: Path) -> bytes:
    """records.log up to the end of its last seal frame."""
    data = (d / LOG_FILE).read_bytes()
    end = off = 0
    for field, frame in split_frames(data):
        off += len(frame)
        if field & SEAL:
            end = off
    return data[:end]


@pytest.fixture
def log(tmp_path: Path, keys: Any) -> Path:
    """A real log of 6 signed decision records, one sealed batch each."""
    d = tmp_path / "worker-a"
    write_log(d, decisions(keys, KEY, 6))
    return d


def test_a_shipped_log_fetches_back_byte_for_byte_and_verifies(log: Path, tmp_path: Path) -> None:
    """Every sealed byte and checkpoint reaches the store; the fetched copy is the log and verifies."""
    store = DirStore(tmp_path / "store")
    done = ship_once(log, store, "fleet/eu")
    assert done.origin == ORIGIN and done.ranges == 1 and done.end.size == 6 and done.notes >= 1
    assert stored_logs(store, "fleet/eu") == [ORIGIN]
    fetch(store, "fleet/eu", ORIGIN, tmp_path / "copy")
    assert (tmp_path / "copy" / LOG_FILE).read_bytes() == sealed_prefix(log) == (log / LOG_FILE).read_bytes()
    assert verify_log(tmp_path / "copy", public_key=PUB, workers=1).ok


def test_shipping_again_sends_only_what_is_new_in_order(log: Path, tmp_path: Path, keys: Any) -> None:
    """A second pass sends nothing; after more records, only ranges after the store's end."""
    store = DirStore(tmp_path / "store")
    first = ship_once(log, store)
    assert ship_once(log, store).ranges == 0
    write_log(log, decisions(keys, KEY, 4, start=6))
    second = ship_once(log, store)
    assert second.ranges == 1 and second.end.start == first.end.end and second.end.size == 10
    names = store.list(log_prefix("", ORIGIN) + "records/")
    assert shipped_cursor(names, "store") == Range(0, len(sealed_prefix(log)), 10)


def test_small_ranges_each_end_on_a_seal(log: Path) -> None:
    """With a tiny range limit every object holds one sealed batch, and the ranges tile the log."""
    data = (log / LOG_FILE).read_bytes()
    start, size, ranges = 0, 0, []
    while (r := next_range(data[start:], start, size, limit=1)) is not None:
        assert split_frames(data[r.start : r.end])[-1][0] & SEAL
        ranges.append(r)
        start, size = r.end, r.size
    assert len(ranges) >= 6 and ranges[-1].end == len(sealed_prefix(log)) and ranges[-1].size == 6


def test_an_unsealed_tail_is_not_shipped(log: Path, tmp_path: Path) -> None:
    """Bytes after the last seal (a write in progress, or torn by a crash) stay local."""
    sealed = len((log / LOG_FILE).read_bytes())
    with (log / LOG_FILE).open("ab") as f:
        f.write(b"\x00" * 20)  # a torn frame header
    done = ship_once(log, DirStore(tmp_path / "store"))
    assert done.end.end == sealed


def test_the_store_holding_other_bytes_is_a_conflict_and_nothing_is_replaced(
    log: Path, tmp_path: Path
) -> None:
    """A range key the store already holds with other bytes (another log of this origin) is refused."""
    store = DirStore(tmp_path / "store")
    end = len(sealed_prefix(log))
    size = 6
    key = range_key("", ORIGIN, Range(0, end, size))
    assert store.put_once(key, b"x" * end) is None
    with pytest.raises(ShipError, match="already holds other bytes") as e:
        ship_once(log, store)
    assert key in e.value.diagnostic()
    assert store.get(key) == b"x" * end


def test_a_gap_in_the_stores_copy_is_refused(log: Path, tmp_path: Path) -> None:
    """A store listing with a hole (a range deleted from the store) names the range after it."""
    store = DirStore(tmp_path / "store")
    store.put_once(range_key("", ORIGIN, Range(100, 200, 3)), b"y" * 100)
    with pytest.raises(ShipError, match="a gap") as e:
        ship_once(log, store)
    assert "records/" in e.value.diagnostic() and "00000000000000000100-" in e.value.diagnostic()


def test_a_log_shorter_than_its_shipped_copy_is_refused(log: Path, tmp_path: Path, keys: Any) -> None:
    """A log that lost sealed bytes the store holds is never shipped over."""
    store = DirStore(tmp_path / "store")
    ship_once(log, store)
    data = (log / LOG_FILE).read_bytes()
    (log / LOG_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ShipError, match="lost sealed bytes") as e:
        ship_once(log, store)
    assert str(log / LOG_FILE) in e.value.diagnostic()


def test_a_damaged_frame_is_not_shipped(log: Path, tmp_path: Path) -> None:
    """A changed byte in a sealed record stops shipping at that record, naming it and its offset."""
    data = bytearray((log / LOG_FILE).read_bytes())
    first = len(split_frames(bytes(data))[0][1])
    data[first + 60] ^= 1  # inside the second frame's payload
    (log / LOG_FILE).write_bytes(bytes(data))
    store = DirStore(tmp_path / "store")
    with pytest.raises(ShipError, match=r"at byte offset \d+: .*not shipped") as e:
        ship_once(log, store, limit=1)
    assert str(log / LOG_FILE) in e.value.diagnostic()


def test_an_origin_that_is_no_key_is_refused(tmp_path: Path, keys: Any) -> None:
    """An origin with a `..` segment cannot name objects (it would climb out of its prefix)."""
    d = tmp_path / "log"
    write_log(d, decisions(keys, KEY, 1), origin="semgov/../other")
    with pytest.raises(ShipError, match="cannot name objects"):
        ship_once(d, DirStore(tmp_path / "store"))


def test_a_copy_changed_in_the_store_fails_verification(log: Path, tmp_path: Path) -> None:
    """A byte changed in the store's copy: the fetched log fails `semgov audit verify`, by record."""
    store = DirStore(tmp_path / "store")
    ship_once(log, store)
    [name] = store.list(log_prefix("", ORIGIN) + "records/")
    path = tmp_path / "store" / ORIGIN / "records" / name
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    fetch(store, "", ORIGIN, tmp_path / "copy")
    report = verify_log(tmp_path / "copy", public_key=PUB, workers=1)
    assert not report.ok


def test_cli_ship_and_fetch_round_trip(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov audit ship` says what it sent; `fetch` rebuilds a log that `audit verify` accepts."""
    store = str(tmp_path / "store")
    assert main(["audit", "ship", str(log), "--to", store + "/fleet"]) == 0
    out = capsys.readouterr().out
    assert f"{ORIGIN}: shipped 1 ranges" in out and "records 0..6" in out
    assert main(["audit", "fetch", store + "/fleet", str(tmp_path / "copy")]) == 0
    fetched = tmp_path / "copy" / ORIGIN.replace("/", "_")
    assert f"-> {fetched}" in capsys.readouterr().out
    assert main(["audit", "verify", str(fetched), "--pubkey", PUB_PEM]) == 0


def test_cli_ship_exit_statuses(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A conflict exits 1 naming the key; an unreachable S3 endpoint exits 4, "nothing lost"."""
    store = DirStore(tmp_path / "store")
    store.put_once(range_key("", ORIGIN, Range(0, len(sealed_prefix(log)), 6)), b"z")
    assert main(["audit", "ship", str(log), "--to", str(tmp_path / "store")]) == 1
    assert "already holds other bytes" in capsys.readouterr().err
    pytest.importorskip("boto3")
    env = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "AWS_REGION": "us-east-1"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.setattr("semgov.audit.stores.S3_CONNECT_TIMEOUT_S", 0.5)
        rc = main(["audit", "ship", str(log), "--to", "s3://audit", "--endpoint-url", "http://127.0.0.1:9"])
    assert rc == 4 and "nothing lost; run it again" in capsys.readouterr().err


def test_cli_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No log in DIR exits 2, a store URL of another scheme 1, and a store holding no log 2, each named."""
    assert main(["audit", "ship", str(tmp_path), "--to", str(tmp_path / "s")]) == 2
    assert "no audit log here" in capsys.readouterr().err
    (tmp_path / LOG_FILE).write_bytes(b"")
    assert main(["audit", "ship", str(tmp_path), "--to", "gs://bucket"]) == 1
    assert "gs://bucket" in capsys.readouterr().err
    assert main(["audit", "fetch", str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    assert "holds no semgov log" in capsys.readouterr().err


def test_a_fleet_shipped_to_one_store_fetches_back_as_a_fleet_that_verifies(
    tmp_path: Path, keys: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two workers' logs shipped to one store come back as a fleet directory `audit verify` checks."""
    store = str(tmp_path / "store")
    for i, name in enumerate(("w1", "w2")):
        write_log(tmp_path / name, decisions(keys, KEY, 3, start=10 * i), origin=f"example.com/semgov/{name}")
        assert main(["audit", "ship", str(tmp_path / name), "--to", store]) == 0
    assert main(["audit", "fetch", store, str(tmp_path / "copy")]) == 0
    capsys.readouterr()
    assert main(["audit", "verify", str(tmp_path / "copy"), "--pubkey", PUB_PEM]) == 0
    out = capsys.readouterr().out
    assert "example.com/semgov/w1" in out and "example.com/semgov/w2" in out
