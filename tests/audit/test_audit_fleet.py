"""One audit view over many workers' logs (issue 36, part 2): verdicts per worker, checks across logs.

Logs are real (the writer, real signed decisions and engine events); a fleet is a directory whose
subdirectories are worker logs, or several log directories. Tampering is done as someone with
write access to a worker's directory would: a changed record, a log copied to a second worker,
a second history under one origin, a record copied between logs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from semgov.audit.fleet_dir import find_logs, verify_fleet
from semgov.audit.frames import FRAME_HEADER, LOG_FILE
from semgov.cli.main import main
from tests.audit_fixtures import KEY, PUB, PUB_PEM, decisions, realization, record_payloads, write_log

N = 6


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    """A fleet directory of two workers, w0 and w1, each its own origin and checkpoints."""
    d = tmp_path_factory.mktemp("fleet") / "fleet"
    recs = decisions(keys, KEY, 2 * N)
    write_log(d / "w0", recs[:N], origin="semgov/w0", checkpoint_every=2)
    write_log(d / "w1", recs[N:], origin="semgov/w1", checkpoint_every=2)
    (d / "README").write_text("not a log")
    return d


@pytest.fixture
def fleet(pristine: Path, tmp_path: Path) -> Path:
    """A copy of the pristine fleet to tamper with."""
    d = tmp_path / "fleet"
    shutil.copytree(pristine, d)
    return d


def _verify(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, str]:
    code = main(["audit", "verify", *map(str, paths), "--pubkey", PUB_PEM, "--workers", "1"])
    return code, capsys.readouterr().out


def test_a_fleet_directory_gives_per_worker_verdicts(
    pristine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory of worker logs verifies as one fleet: verdicts, origins, checkpoints, totals."""
    code, out = _verify(capsys, pristine)
    assert code == 0, out
    assert out.startswith("fleet: 2 audit logs\n")
    assert f"worker w0: {pristine / 'w0'} origin semgov/w0: {N} records" in out
    assert "origin semgov/w1" in out and "checkpoints: 2, 4, 6" in out
    assert f"totals: {2 * N} records" in out and "origins distinct" in out
    assert out.rstrip().endswith("the checks across them pass")


def test_several_paths_are_one_fleet_and_one_log_reads_as_before(
    pristine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two log directories make a fleet; one log directory gives the one-log output unchanged."""
    code, out = _verify(capsys, pristine / "w0", pristine / "w1")
    assert code == 0 and "fleet: 2 audit logs" in out, out
    code, out = _verify(capsys, pristine / "w0")
    assert code == 0 and out.startswith(f"audit log {pristine / 'w0'}: {N} records"), out
    assert find_logs([pristine / "w0"]) is None and [n for n, _ in find_logs([pristine]) or []] == [
        "w0",
        "w1",
    ]


def test_a_changed_record_names_the_workers_log_file_and_record(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte changed in record 3 of worker w1's log: FAILED names w1's records.log and record 3."""
    path = fleet / "w1" / LOG_FILE
    data = bytearray(path.read_bytes())
    off = 0
    for _ in range(3):  # skip three record frames and the seals between them
        while True:
            index, length, _ = FRAME_HEADER.unpack_from(data, off)
            off += FRAME_HEADER.size + length
            if not index >> 63:
                break
    while FRAME_HEADER.unpack_from(data, off)[0] >> 63:
        off += FRAME_HEADER.size + FRAME_HEADER.unpack_from(data, off)[1]
    data[off + FRAME_HEADER.size + 30] ^= 0x01
    path.write_bytes(bytes(data))
    code, out = _verify(capsys, fleet)
    assert code == 1
    assert f"FAILED: worker w1 ({fleet / 'w1' / LOG_FILE}): record 3: " in out, out
    assert "worker w0: " in out and "-> OK" in out.split("worker w1")[0]


def test_two_logs_naming_one_origin_are_an_error(fleet: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A worker log copied to a second worker: the shared origin and the shared decision ids are named."""
    shutil.copytree(fleet / "w0", fleet / "w2")
    code, out = _verify(capsys, fleet)
    assert code == 1
    assert "origin 'semgov/w0' is named by 2 logs: worker w0" in out and f"worker w2 ({fleet / 'w2'})" in out
    assert "is in 2 workers' logs: worker w0 record 0" in out and "worker w2 record 0" in out


def test_a_forked_log_is_caught_across_workers(
    fleet: Path, keys: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second history signed under w0's origin in another worker's directory: a fork at each shared size."""
    write_log(fleet / "w2", decisions(keys, KEY, N, start=100), origin="semgov/w0", checkpoint_every=2)
    fr = verify_fleet(find_logs([fleet]) or [], public_key=PUB, workers=1)
    assert all(w.report.ok for w in fr.workers)  # each log, alone, verifies
    forks = [p for p in fr.problems if p.startswith("fork: ")]
    assert forks and "fork: log 'semgov/w0' has 2 different trees of size 1" in forks[0]
    assert "worker w0 " in forks[0] and "worker w2 " in forks[0] and "records.log seal for size 1" in forks[0]
    code, out = _verify(capsys, fleet)
    assert code == 1 and "FAILED: origin 'semgov/w0' is named by 2 logs" in out


def test_a_record_copied_into_another_workers_log_is_reported(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Worker w2's log holds (through the real writer) a genuine record of w0's: both places are named."""
    rec = record_payloads(fleet / "w0")[1]
    write_log(fleet / "w2", [rec], origin="semgov/w2")
    code, out = _verify(capsys, fleet)
    did = json.loads(rec)["decision_id"]
    assert code == 1
    assert f"decision_id {did!r} is in 2 workers' logs: worker w0 record 1" in out
    assert f"worker w2 record 0 ({fleet / 'w2' / LOG_FILE})" in out


def test_fleet_show_and_stats_give_every_worker(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show jsonl leads each record with its worker and origin; stats json: the workers and the fleet."""
    assert main(["audit", "show", str(pristine), "--format", "jsonl"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 * N and {(r["worker"], r["origin"]) for r in rows} == {
        ("w0", "semgov/w0"),
        ("w1", "semgov/w1"),
    }
    assert main(["audit", "show", str(pristine)]) == 0
    out = capsys.readouterr().out
    assert "worker w0 (origin semgov/w0):" in out and "worker w1 (origin semgov/w1):" in out
    assert main(["audit", "stats", str(pristine), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [w["records"] for w in doc["workers"]] == [N, N] and doc["fleet"]["records"] == 2 * N
    assert doc["cross_worker_problems"] == []
    assert main(["audit", "stats", str(pristine)]) == 0
    out = capsys.readouterr().out
    assert "worker w1 (" in out and f"fleet (2 workers):\n{2 * N} records" in out


def test_a_realization_of_another_workers_allow_is_flagged(
    fleet: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A realization in w2's log of an allow that only w0's log holds: KV crossed workers, stats exits 1."""
    allow = next(r for r in record_payloads(fleet / "w0") if json.loads(r)["decision"] == "allow")
    write_log(fleet / "w2", [realization(allow, KEY)], origin="semgov/w2")
    assert main(["audit", "stats", str(fleet)]) == 1
    out = capsys.readouterr().out
    did = json.loads(allow)["decision_id"]
    assert (
        f"ACROSS WORKERS: worker w2 record 0: realization of decision {did!r}, an allow in worker w0" in out
    )


def test_fleet_report_opens_with_the_fleet_verdict(pristine: Path, tmp_path: Path) -> None:
    """audit report over a fleet directory: one page, verified, each worker's line in the verdict."""
    out = tmp_path / "r.html"
    assert (
        main(["audit", "report", str(pristine), "--out", str(out), "--pubkey", PUB_PEM, "--workers", "1"])
        == 0
    )
    page = out.read_text()
    assert "VERIFIED: every one of the 2 logs verifies" in page and "origin semgov/w1" in page
