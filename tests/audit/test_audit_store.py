"""The durable audit log: group commit, recovery, checkpoints, writer failures, SIGKILL crashes."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov.audit import merkle
from semgov.audit.errors import (
    AuditWriteError,
    CheckpointConflictError,
    CorruptLogError,
    LogLockedError,
    TornTailError,
)
from semgov.audit.frames import FRAME_HEADER, SEAL_FLAG
from semgov.audit.keyring import key_name_for
from semgov.audit.note import open_checkpoint
from semgov.audit.reader import iter_records, read_checkpoint
from semgov.audit.recovery import Recovery
from semgov.audit.store import AuditLog
from semgov.errors import SemgovError
from semgov.signing.keys import SigningKey

KEY_HEX = "5e" * 32
KEY = SigningKey.from_private(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(KEY_HEX)))
ORIGIN = "semgov.test/audit"


def rec(i: int) -> bytes:
    """Record ``i``: carries its index, lengths vary."""
    return b"record %d " % i + b"x" * (i % 37)


def open_log(d: Path, **kw: Any) -> AuditLog:
    kw.setdefault("commit_interval", 0.0)
    return AuditLog.open(d, signing_key=KEY, origin=ORIGIN, **kw)


def write_records(d: Path, n: int, start: int = 0, **kw: Any) -> None:
    with open_log(d, **kw) as log:
        for i in range(start, start + n):
            assert log.append(rec(i)).index == i
        assert log.flush() == start + n


def frame(index: int, record: bytes) -> bytes:
    digest = hashlib.sha256(index.to_bytes(8, "big") + record).digest()
    return FRAME_HEADER.pack(index, len(record), digest) + record


def frame_offsets(d: Path) -> list[int]:
    """Byte offset of every record frame in records.log (assumed well formed; seal frames skipped)."""
    data = (d / "records.log").read_bytes()
    out, off = [], 0
    while off < len(data):
        (index, length, _) = FRAME_HEADER.unpack_from(data, off)
        if not index & SEAL_FLAG:
            out.append(off)
        off += FRAME_HEADER.size + length
    return out


def leaves(d: Path) -> list[bytes]:
    return [merkle.leaf_hash(r) for _, r in iter_records(d)]


def recovery_at(d: Path, index: int) -> dict[str, Any]:
    """The recovery record (``semgov.audit_recovery/v1``) a recovery appended as record ``index``."""
    got = json.loads(dict(iter_records(d))[index])
    assert got["schema"] == "semgov.audit_recovery/v1" and got["key_id"] == KEY.key_id
    return dict(got)


def checkpoint_of(note: bytes | None) -> tuple[int, bytes]:
    assert note is not None
    cp = open_checkpoint(note, key_name_for(KEY.key_id), KEY.public_key)
    assert cp.origin == ORIGIN
    return cp.size, cp.root


def test_round_trip_and_reopen(tmp_path: Path) -> None:
    """Appended records come back in order; a reopened log continues with the same size and root."""
    d = tmp_path / "log"
    log = open_log(d)
    tickets = [log.append(rec(i)) for i in range(10)]
    assert [t.index for t in tickets] == list(range(10))
    assert all(t.wait(5) for t in tickets) and all(t.done() for t in tickets)
    assert log.flush() == 10 and log.size == 10
    log.close()
    log.close()  # idempotent
    assert list(iter_records(d)) == [(i, rec(i)) for i in range(10)]
    with open_log(d) as log:
        assert log.recovery.clean and log.size == 10
        assert log.root() == (10, merkle.root(leaves(d)))
        assert log.append(rec(10)).index == 10
        log.flush()
    assert list(iter_records(d)) == [(i, rec(i)) for i in range(11)]
    assert checkpoint_of(read_checkpoint(d)) == (11, merkle.root(leaves(d)))
    state = json.loads((d / "state.json").read_text())
    assert state["size"] == 11 and state["log_bytes"] == (d / "records.log").stat().st_size
    assert state["checkpoint_size"] == 11


def test_concurrent_producers_get_their_own_indices(tmp_path: Path) -> None:
    """Records from several threads land at exactly the index their ticket names."""
    got: dict[int, bytes] = {}
    mu = threading.Lock()
    with open_log(tmp_path, commit_interval=0.001, max_batch=64) as log:

        def produce(t: int) -> None:
            for j in range(400):
                r = b"thread %d seq %d" % (t, j)
                ticket = log.append(r)
                with mu:
                    got[ticket.index] = r

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert log.flush() == 1600
    assert dict(iter_records(tmp_path)) == got


def test_append_rejects_non_bytes_and_closed_log(tmp_path: Path) -> None:
    """append takes bytes only, and nothing once the log is closed."""
    log = open_log(tmp_path)
    with pytest.raises(TypeError):
        log.append("text")  # type: ignore[arg-type]
    log.close()
    with pytest.raises(SemgovError, match="closed"):
        log.append(b"late")


@pytest.mark.parametrize("cut", [1, 3, 4, 20, 36, 37, 40, 47])
def test_torn_tail_truncated_on_open(tmp_path: Path, cut: int) -> None:
    """A frame cut short in its length, hash or body is truncated on open; earlier records stay."""
    write_records(tmp_path, 5)
    log_path = tmp_path / "records.log"
    before = log_path.read_bytes()
    torn = frame(5, rec(5))[:cut]  # a crash in the middle of writing record 5
    assert cut < len(frame(5, rec(5)))
    with log_path.open("ab") as f:
        f.write(torn)
    with pytest.raises(TornTailError) as exc:
        list(iter_records(tmp_path))
    assert exc.value.index == 5 and exc.value.offset == len(before) and exc.value.tail_bytes == cut
    with open_log(tmp_path) as log:
        assert log.recovery.size == 5 and log.size == 6  # record 5: the recovery's own record
        assert log.recovery.truncated_bytes == cut and log.recovery.truncated_at == len(before)
        assert log_path.read_bytes().startswith(before)
        assert log.append(rec(5)).index == 6
    got = [r for _, r in iter_records(tmp_path)]
    assert got[:5] + got[6:] == [rec(i) for i in range(6)]
    cutoff = recovery_at(tmp_path, 5)
    assert cutoff["cause"] == "torn_write" and cutoff["cut"]["bytes"] == cut


def test_torn_tail_without_state_json(tmp_path: Path) -> None:
    """With no state.json: a last frame that fails its hash, or a zero-filled tail, is torn (kept aside)."""
    bad_last = frame(3, rec(3))[:-1] + b"?"
    for tail in (bad_last, b"\0" * 5000, frame(3, rec(3))[:30]):
        d = tmp_path / str(len(tail))
        write_records(d, 3)
        (d / "state.json").unlink()
        with (d / "records.log").open("ab") as f:
            f.write(tail)
        with open_log(d) as log:
            assert log.recovery.size == 3 and log.size == 4 and log.recovery.rebuilt
            assert log.recovery.truncated_bytes == len(tail)
            assert Path(log.recovery.quarantine_file).read_bytes() == tail
        assert [i for i, _ in iter_records(d)] == [0, 1, 2, 3]
        assert recovery_at(d, 3)["cut"]["bytes"] == len(tail)


def test_hole_in_last_batch_after_durable_point_is_torn(tmp_path: Path) -> None:
    """Past state.json's durable end a bad frame is a torn write, even with whole frames after it."""
    write_records(tmp_path, 3)
    log_path = tmp_path / "records.log"
    before = log_path.read_bytes()
    hole = b"\0" * len(frame(3, rec(3)))  # a page that never reached the disk
    log_path.write_bytes(before + hole + frame(4, rec(4)))
    with open_log(tmp_path) as log:
        assert log.recovery.size == 3 and log.recovery.truncated_bytes == len(hole) + len(frame(4, rec(4)))
    assert log_path.read_bytes().startswith(before)


def test_corrupt_middle_frame_refused(tmp_path: Path) -> None:
    """A bad frame before the end is refused with its index and offset, and the file is untouched."""
    write_records(tmp_path, 5)
    log_path = tmp_path / "records.log"
    offsets = frame_offsets(tmp_path)
    data = bytearray(log_path.read_bytes())
    data[offsets[2] + FRAME_HEADER.size + 3] ^= 0x01
    log_path.write_bytes(bytes(data))
    (tmp_path / "state.json").unlink()  # force a rebuild: the corruption is found on open
    with pytest.raises(CorruptLogError) as exc:
        open_log(tmp_path)
    assert exc.value.index == 2 and exc.value.offset == offsets[2]
    assert f"record 2 at byte offset {offsets[2]}" in str(exc.value)
    assert log_path.read_bytes() == bytes(data)
    it = iter_records(tmp_path)
    assert [next(it), next(it)] == [(0, rec(0)), (1, rec(1))]
    with pytest.raises(CorruptLogError, match="record 2"):
        next(it)


def test_corrupt_frame_found_by_verify_with_fresh_state(tmp_path: Path) -> None:
    """verify=True re-hashes a log whose state.json matches; a bad acknowledged frame is refused."""
    write_records(tmp_path, 4)
    log_path = tmp_path / "records.log"
    data = bytearray(log_path.read_bytes())
    data[frame_offsets(tmp_path)[3] + FRAME_HEADER.size + 2] ^= 0x01  # the last record: acknowledged durable
    log_path.write_bytes(bytes(data))
    with open_log(tmp_path) as log:  # state.json matches the length: not re-read
        assert log.recovery.clean
    with pytest.raises(CorruptLogError) as exc:
        open_log(tmp_path, verify=True)
    assert exc.value.index == 3


@pytest.mark.parametrize("damage", ["missing", "stale", "garbage"])
def test_state_json_stale_or_missing_is_rebuilt(tmp_path: Path, damage: str) -> None:
    """A missing, stale or unreadable state.json is rebuilt from the log."""
    write_records(tmp_path, 3)
    old_state = (tmp_path / "state.json").read_bytes()
    write_records(tmp_path, 4, start=3)
    state = tmp_path / "state.json"
    if damage == "missing":
        state.unlink()
    elif damage == "stale":
        state.write_bytes(old_state)
    else:
        state.write_text('{"size": 7, "log_bytes": "x"}')
    with open_log(tmp_path) as log:
        assert log.recovery.rebuilt and log.recovery.rebuild_reason
        assert log.size == 7 and log.root() == (7, merkle.root(leaves(tmp_path)))
        log.append(rec(7))
    doc = json.loads(state.read_text())
    assert doc["size"] == 8 and doc["log_bytes"] == (tmp_path / "records.log").stat().st_size


def test_state_json_ahead_of_the_log_is_refused(tmp_path: Path) -> None:
    """A state.json acknowledging more bytes than records.log holds is refused, naming both sizes."""
    write_records(tmp_path, 3)
    state = tmp_path / "state.json"
    doc = json.loads(state.read_text())
    doc["log_bytes"] += 1000
    state.write_text(json.dumps(doc))
    with pytest.raises(CorruptLogError, match=f"state.json records {doc['log_bytes']} bytes"):
        open_log(tmp_path)
    state.unlink()
    with open_log(tmp_path) as log:
        assert log.size == 3 and log.recovery.rebuilt


def test_second_writer_refused_readers_fine(tmp_path: Path) -> None:
    """A second writer gets a clear error while the first holds LOCK; readers still read."""
    log = open_log(tmp_path)
    log.append(rec(0))
    log.flush()
    with pytest.raises(LogLockedError, match=rf"locked by another writer \(pid {os.getpid()}\)"):
        open_log(tmp_path)
    assert list(iter_records(tmp_path)) == [(0, rec(0))]
    log.close()
    with open_log(tmp_path) as again:
        assert again.size == 1


def test_checkpoints_every_n_and_on_close(tmp_path: Path) -> None:
    """Checkpoints every N records and on close verify, match the log, and only grow."""
    with open_log(tmp_path, checkpoint_every=5, checkpoint_interval=3600) as log:
        assert log.key_name == key_name_for(KEY.key_id)
        for i in range(23):
            log.append(rec(i)).wait(5)
        assert log.checkpoint_size >= 20
    hashes = leaves(tmp_path)
    sizes = sorted(int(p.stem) for p in (tmp_path / "checkpoints").glob("*.note"))
    assert sizes[-1] == 23 and len(sizes) >= 5
    assert all(b - a >= 1 for a, b in zip(sizes, sizes[1:], strict=False))
    for s in sizes:
        note = (tmp_path / "checkpoints" / f"{s}.note").read_bytes()
        assert checkpoint_of(note) == (s, merkle.root(hashes[:s]))
    assert checkpoint_of(read_checkpoint(tmp_path)) == (23, merkle.root(hashes))


def test_checkpoint_after_interval(tmp_path: Path) -> None:
    """An idle writer signs a checkpoint once checkpoint_interval has passed."""
    with open_log(tmp_path, checkpoint_interval=0.05) as log:
        log.append(rec(0))
        log.flush()
        deadline = time.monotonic() + 5
        while read_checkpoint(tmp_path) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checkpoint_of(read_checkpoint(tmp_path))[0] == 1


def test_refuses_log_shorter_than_checkpoint(tmp_path: Path) -> None:
    """A log cut below its last signed checkpoint is refused, and not touched."""
    write_records(tmp_path, 10)
    log_path = tmp_path / "records.log"
    offsets = frame_offsets(tmp_path)
    for cut in (offsets[8] + 10, offsets[6]):  # inside a frame, then a clean boundary
        with log_path.open("r+b") as f:
            f.truncate(cut)
        with pytest.raises(CheckpointConflictError, match=r"checkpoint says 10: refusing to continue"):
            open_log(tmp_path)
        assert log_path.stat().st_size == cut
    (tmp_path / "state.json").unlink()
    with pytest.raises(CheckpointConflictError, match=r"log has 6 records but checkpoint says 10"):
        open_log(tmp_path)


def test_refuses_log_that_does_not_extend_checkpoint(tmp_path: Path) -> None:
    """A log whose records no longer hash to the signed root is refused (no fork is signed)."""
    write_records(tmp_path, 6)
    log_path = tmp_path / "records.log"
    offsets = frame_offsets(tmp_path)
    data = log_path.read_bytes()
    forged = rec(2)[:-1] + b"y"  # same length, valid frame
    log_path.write_bytes(data[: offsets[2]] + frame(2, forged) + data[offsets[3] :])
    (tmp_path / "state.json").unlink()
    with pytest.raises(CheckpointConflictError, match="do not hash to the signed checkpoint"):
        open_log(tmp_path)


def _fault(real: Callable[..., Any], fd_of: Callable[[], int], after: int, fail: Callable[..., Any]) -> Any:
    calls = {"n": 0}

    def fake(fd: int, *args: Any) -> Any:
        if fd == fd_of():
            calls["n"] += 1
            if calls["n"] > after:
                return fail(fd, *args)
        return real(fd, *args)

    return fake


def _enospc(*_: Any) -> Any:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["fsync", "write", "partial_write"])
def test_writer_failure_is_loud_and_keeps_durable_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A failing write or fsync fails every later call; what was acknowledged survives a reopen."""
    log = open_log(tmp_path)
    for i in range(3):
        log.append(rec(i))
    assert log.flush() == 3
    real_write, real_fsync = os.write, os.fsync

    wrote = {"n": 0}

    def partial(fd: int, data: Any) -> int:
        wrote["n"] += 1
        if wrote["n"] == 1:  # half the batch reaches the file, then the disk is full
            return int(real_write(fd, bytes(data[: len(data) // 2])))
        return int(_enospc())

    if where == "fsync":
        monkeypatch.setattr(os, "fsync", _fault(real_fsync, lambda: log._log_fd, 0, _enospc))
    elif where == "write":
        monkeypatch.setattr(os, "write", _fault(real_write, lambda: log._log_fd, 0, _enospc))
    else:
        monkeypatch.setattr(os, "write", _fault(real_write, lambda: log._log_fd, 0, partial))
    tickets = [log.append(rec(i)) for i in range(3, 6)]
    with pytest.raises(AuditWriteError, match="No space left on device"):
        tickets[0].wait(5)
    assert not any(t.done() for t in tickets) and log.size == 3
    with pytest.raises(AuditWriteError):
        log.append(rec(6))
    with pytest.raises(AuditWriteError):
        log.flush()
    with pytest.raises(AuditWriteError, match="3 records are durable"):
        log.close()
    monkeypatch.undo()
    with open_log(tmp_path) as again:  # the lock was released
        assert again.size >= 3
        if where == "partial_write":  # whole frames of the half are unsealed: moved to quarantine, not kept
            assert again.recovery.size == 3 and again.recovery.truncated_bytes > 0
            assert again.size == 4 and recovery_at(tmp_path, 3)["cause"] == "unsealed_frames"
            assert Path(again.recovery.quarantine_file).is_file()
    got = list(iter_records(tmp_path))
    assert got[:3] == [(i, rec(i)) for i in range(3)]
    assert all(r == rec(i) or b"semgov.audit_recovery/v1" in r for i, r in got)


def test_key_name_follows_c2sp_rules() -> None:
    """Key ids become C2SP key names: no spaces or '+', ':' kept."""
    assert key_name_for("ed25519:0123abcd") == "ed25519:0123abcd"
    assert key_name_for("a b+c\td") == "a_b_c_d"


# --- crash test ------------------------------------------------------------------------------

# A zygote: imports once, then for each "<dir> <seed>" line on stdin forks a worker that appends
# records and prints "ack <index>" only after the record's ticket is durable; the test SIGKILLs
# the worker and the zygote answers "exit <status>" once it is reaped. rec() is repeated here.
# Half the workers write in short pieces (as write(2) may), so that kills also leave torn frames.
_CRASH_CHILD = r"""
import os, random, sys, time, traceback
from pathlib import Path
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from semgov.audit.store import AuditLog
from semgov.signing.keys import SigningKey

KEY = SigningKey.from_private(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sys.argv[1])))
ORIGIN = sys.argv[2]

def rec(i):
    return b"record %d " % i + b"x" * (i % 37)

def worker(directory, seed):
    os.write(1, b"pid %d\n" % os.getpid())
    rng = random.Random(seed)
    if rng.random() < 0.5:  # write(2) may write less than asked: split writes, so kills tear frames
        real_write = os.write
        def short_write(fd, data):
            if fd <= 2:
                return real_write(fd, data)
            time.sleep(0.00005)  # a slow disk: kills land inside writes
            return real_write(fd, bytes(data[: rng.randint(1, 64)]))
        os.write = short_write
    log = AuditLog.open(
        directory, signing_key=KEY, origin=ORIGIN,
        checkpoint_every=rng.choice([1, 7, 50]), checkpoint_interval=0.002,
        commit_interval=rng.choice([0.0, 0.0005]), max_batch=rng.choice([8, 4096]),
    )
    i = log.size
    os.write(1, b"ready %d\n" % i)
    while True:
        tickets = []
        for _ in range(rng.randint(1, 40)):
            t = log.append(rec(i))
            assert t.index == i, (t.index, i)
            tickets.append(t)
            i += 1
        for t in tickets:
            assert t.wait(30)
        os.write(1, b"".join(b"ack %d\n" % t.index for t in tickets))

while True:
    line = sys.stdin.readline()
    if not line:
        break
    directory, seed = line.split()
    pid = os.fork()
    if pid == 0:
        try:
            worker(Path(directory), int(seed))
        except BaseException:
            os.write(1, b"err " + traceback.format_exc().replace("\n", " | ").encode() + b"\n")
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    os.write(1, b"exit %d\n" % status)
"""

CRASH_ITERATIONS = 200
CRASH_ITERATIONS_PER_DIR = 10


def _check_after_crash(d: Path, acked: list[int], seen_notes: set[int]) -> Recovery:
    """Reopen after a kill: every acknowledged record is there, exact; checkpoints agree."""
    with open_log(d) as log:  # must open: a torn tail is cut, nothing else is wrong
        size = log.size
        recovery = log.recovery
        got = list(iter_records(d))  # a reader alongside the writer: no torn tail any more
        assert [i for i, _ in got] == list(range(size))
        for i, r in got:  # a recovery that cut a torn tail left its signed record
            assert r == rec(i) or b'"schema":"semgov.audit_recovery/v1"' in r, f"record {i} differs"
        if recovery.truncated_bytes:
            assert recovery_at(d, recovery.size)["cut"]["bytes"] == recovery.truncated_bytes
        missing = [i for i in acked if i >= size]
        assert not missing, f"acknowledged records lost: {missing[:5]}... (log has {size})"
        frontier = merkle.Frontier()
        roots = [frontier.root()]
        for _, r in got:
            frontier.append(merkle.leaf_hash(r))
            roots.append(frontier.root())
        assert log.root() == (size, roots[-1])
        cp_size, cp_root = checkpoint_of(read_checkpoint(d)) if read_checkpoint(d) else (0, roots[0])
        assert cp_size <= size and cp_root == roots[cp_size]
        for p in (d / "checkpoints").glob("*.note"):
            s = int(p.stem)
            if s not in seen_notes:  # every checkpoint ever signed is a prefix of this log
                assert checkpoint_of(p.read_bytes()) == (s, roots[s])
                seen_notes.add(s)
    return recovery


def test_sigkill_at_random_moments_loses_no_acknowledged_record(tmp_path: Path) -> None:
    """SIGKILL a writer at random moments: the log reopens and holds every acknowledged record."""
    rng = random.Random(20261129)
    proc = subprocess.Popen(
        [sys.executable, "-c", _CRASH_CHILD, KEY_HEX, ORIGIN],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    total_acked = 0
    killed_mid_run = rebuilt = truncated = 0
    seen: dict[Path, set[int]] = {}
    try:
        for it in range(CRASH_ITERATIONS):
            d = tmp_path / f"log{it // CRASH_ITERATIONS_PER_DIR}"
            proc.stdin.write(f"{d} {rng.randrange(1 << 30)}\n".encode())
            proc.stdin.flush()
            first = proc.stdout.readline()
            assert first.startswith(b"pid "), first
            if rng.random() < 0.9:  # mostly while appending; else possibly while opening
                ready = proc.stdout.readline()
                assert ready.startswith(b"ready "), ready
            time.sleep(rng.uniform(0.0, 0.03))
            try:
                os.kill(int(first.split()[1]), signal.SIGKILL)
            except ProcessLookupError:
                pass
            acked: list[int] = []
            status = None
            for line in iter(proc.stdout.readline, b""):
                if line.startswith(b"ready "):
                    continue
                if line.startswith(b"ack "):
                    acked.append(int(line.split()[1]))
                elif line.startswith(b"exit "):
                    status = int(line.split()[1])
                    break
                else:
                    pytest.fail(f"iteration {it}: worker said {line.decode(errors='replace')}")
            assert status is not None, "the zygote died"
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
            killed_mid_run += bool(acked)
            recovery = _check_after_crash(d, acked, seen.setdefault(d, set()))
            rebuilt += recovery.rebuilt
            truncated += bool(recovery.truncated_bytes)
            total_acked += len(acked)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    # The kills must land while records are being written, not only at start-up.
    assert killed_mid_run >= CRASH_ITERATIONS // 4, killed_mid_run
    assert total_acked >= 2 * CRASH_ITERATIONS, total_acked
    assert truncated >= 5, truncated  # and while frames were half written
    print(
        f"crash test: {CRASH_ITERATIONS} kills ({killed_mid_run} after acknowledgements), "
        f"{total_acked} acknowledged records checked; {rebuilt} reopens rebuilt from the log, "
        f"{truncated} cut a torn tail"
    )


# ---- hostile state.json and frame headers ----------------------------------------------------------


@pytest.mark.parametrize(
    "content, why",
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper than"),
        (b'{"size": 1, "size": 4}', "duplicate key 'size'"),
        (b'{"size": NaN}', "NaN is not JSON"),
        (b'{"size": 4, "log_bytes": 1e400, "checkpoint_size": 4, "frontier": {}}', "non-negative integers"),
        (b"[4]", "expected an object"),
        (b"\xff", "not UTF-8"),
        (b'{"log_bytes": 1}', "no 'size' member"),
    ],
)
def test_hostile_state_json_is_rebuilt(tmp_path: Path, content: bytes, why: str) -> None:
    """A deep, duplicate-key, NaN, 1e400 or non-object state.json is malformed: rebuilt, no crash."""
    write_records(tmp_path, 4)
    (tmp_path / "state.json").write_bytes(content)
    with open_log(tmp_path) as log:
        assert log.recovery.rebuilt and why in log.recovery.rebuild_reason, log.recovery
        assert log.size == 4 and log.root() == (4, merkle.root(leaves(tmp_path)))
        log.append(rec(4))
    assert [i for i, _ in iter_records(tmp_path)] == list(range(5))
    assert json.loads((tmp_path / "state.json").read_bytes())["size"] == 5


@pytest.mark.parametrize("crashed", [False, True])
def test_wrong_frontier_in_state_json_is_rebuilt(tmp_path: Path, crashed: bool) -> None:
    """A well-formed state.json whose frontier is wrong is rebuilt from the log, never signed over."""
    write_records(tmp_path, 6)
    if crashed:  # records past the last checkpoint, as a killed writer leaves them: a running writer's copy
        live = tmp_path / "live"
        shutil.copytree(tmp_path, live)
        log = open_log(live, checkpoint_every=1000, checkpoint_interval=3600)
        for i in range(6, 9):
            log.append(rec(i))
        log.flush()
        deadline = time.monotonic() + 10  # state.json is rewritten just after the batch is acknowledged
        while json.loads((live / "state.json").read_bytes())["size"] != 9 and time.monotonic() < deadline:
            time.sleep(0.002)
        shutil.rmtree(tmp_path / "checkpoints")
        for name in ("records.log", "state.json", "checkpoint", "checkpoints"):
            src = live / name
            (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
        log.close()
        shutil.rmtree(live)
        state = json.loads((tmp_path / "state.json").read_bytes())
        assert state["size"] == 9 and checkpoint_of(read_checkpoint(tmp_path))[0] == 6
    else:
        state = json.loads((tmp_path / "state.json").read_bytes())
    hashes = state["frontier"]["hashes"]
    hashes[-1] = ("1" if hashes[-1][0] == "0" else "0") + hashes[-1][1:]
    (tmp_path / "state.json").write_text(json.dumps(state))
    n = 9 if crashed else 6
    with open_log(tmp_path) as log:
        assert log.recovery.rebuilt and "state.json" in log.recovery.rebuild_reason
        assert log.root() == (n, merkle.root(leaves(tmp_path)))
        log.append(rec(n))
    assert checkpoint_of(read_checkpoint(tmp_path)) == (n + 1, merkle.root(leaves(tmp_path)))


def test_clean_close_reopens_without_rereading(tmp_path: Path) -> None:
    """After a clean close state.json's frontier matches the signed checkpoint: reopening is clean."""
    write_records(tmp_path, 6)
    with open_log(tmp_path) as log:
        assert log.recovery.clean and log.size == 6


@pytest.mark.parametrize("state", ["kept", "missing"])
@pytest.mark.parametrize("which", [0, 2, 4])
def test_frame_index_field_is_checked_on_open(tmp_path: Path, which: int, state: str) -> None:
    """A frame whose stored index was altered (record, hash intact) is corruption at its index and offset."""
    write_records(tmp_path, 5)
    log_path = tmp_path / "records.log"
    offset = frame_offsets(tmp_path)[which]
    data = bytearray(log_path.read_bytes())
    data[offset + 7] ^= 0x01
    log_path.write_bytes(bytes(data))
    if state == "missing":
        (tmp_path / "state.json").unlink()  # no durable bound: still not a torn tail, even at the end
    with pytest.raises(CorruptLogError) as exc:
        open_log(tmp_path, verify=state == "kept")  # a matching state.json is only re-read on verify
    assert exc.value.index == which and exc.value.offset == offset
    assert f"record {which} at byte offset {offset}" in str(exc.value) and "index field" in str(exc.value)
    assert log_path.read_bytes() == bytes(data)  # refused, not repaired
    with pytest.raises(CorruptLogError, match=f"record {which} at byte offset {offset}"):
        list(iter_records(tmp_path))


def test_torn_tail_still_cut_after_index_check(tmp_path: Path) -> None:
    """A half-written frame after intact ones is still a torn tail (cut), not corruption."""
    write_records(tmp_path, 3)
    before = (tmp_path / "records.log").read_bytes()
    (tmp_path / "state.json").unlink()
    with (tmp_path / "records.log").open("ab") as f:
        f.write(frame(3, rec(3))[:20])
    with open_log(tmp_path) as log:
        assert log.recovery.size == 3 and log.recovery.truncated_bytes == 20
    assert (tmp_path / "records.log").read_bytes().startswith(before)
