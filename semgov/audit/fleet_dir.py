"""Reading many workers' logs for one fleet view (:mod:`semgov.audit.fleet` has the checks).

A *fleet* is given as several log directories, or as one directory whose subdirectories are
worker logs: a directory that holds no ``records.log`` itself but has subdirectories that do
(each such subdirectory is one worker, named by its directory name; other entries are ignored).
One directory that holds ``records.log`` is one log, read as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from semgov.audit.errors import AuditLogError
from semgov.audit.fleet import (
    FleetReport,
    Tree,
    Worker,
    fork_problems,
    id_problems,
    origin_problems,
    shared_ids,
)
from semgov.audit.frames import LOG_FILE
from semgov.audit.keyring import AuditKeyring
from semgov.audit.verify import LogChecks, Problem
from semgov.audit.verify_dir import leaves_at, verify_log_checks
from semgov.audit.witness_dir import witnessed_notes


def worker_logs(directory: Path) -> list[Path]:
    """The subdirectories of ``directory`` that hold a log (``records.log``), by name."""
    try:
        subs = sorted(p for p in Path(directory).iterdir() if (p / LOG_FILE).is_file())
    except (NotADirectoryError, FileNotFoundError):
        return []
    return subs


def find_logs(paths: Sequence[Path]) -> list[tuple[str, Path]] | None:
    """``(worker name, log directory)`` of every log a fleet view reads, or None for one plain log.

    One path: None when it is a log directory (or holds no worker logs: the one-log reader then
    says what is wrong); else its worker subdirectories. Several paths: each a log directory or a
    fleet directory (its workers named ``<dir>/<sub>``); anything else is an error.
    """
    if len(paths) == 1:
        p = Path(paths[0])
        subs = [] if (p / LOG_FILE).exists() else worker_logs(p)
        return [(s.name, s) for s in subs] or None
    out: list[tuple[str, Path]] = []
    for p in map(Path, paths):
        if (p / LOG_FILE).is_file():
            out.append((p.name or str(p), p))
            continue
        subs = worker_logs(p)
        if not subs:
            raise AuditLogError("no audit log here (records.log is missing, and no worker logs under it)",
                                source=str(p))  # fmt: skip
        out += [(f"{p.name}/{s.name}", s) for s in subs]
    names = [n for n, _ in out]
    if len(set(names)) < len(names):
        out = [(str(d), d) for _, d in out]
    return out


def _where(note_name: str) -> str:
    """The file a note the per-log verification named came from (relative to the log directory)."""
    if note_name == "latest checkpoint":
        return "checkpoint"
    if note_name.startswith("witnessed checkpoint "):
        return note_name.removeprefix("witnessed checkpoint ")
    return "checkpoints/" + note_name.removeprefix("checkpoint ")


def _trees(v: LogChecks) -> list[Tree]:
    """Every signed tree head the per-log verification read: checkpoints, seals, witnessed ones."""
    notes = [n for n in (v.latest, *v.history, *v.witnessed) if n is not None]
    out = [Tree(_where(n.name), n.cp.origin, n.cp.size, n.cp.root) for n in notes]
    return out + [Tree(f"records.log seal for size {s.size}", s.origin, s.size, s.root) for s in v.seals]


def verify_fleet(
    logs: Sequence[tuple[str, Path]],
    *,
    public_key: Ed25519PublicKey | None = None,
    keyring: AuditKeyring | None = None,
    witnesses: Sequence[tuple[str, Ed25519PublicKey]] = (),
    workers: int | None = None,
    allow_unanchored: bool = False,
) -> FleetReport:
    """Verify every log (as ``verify_log``), then the checks across logs (:mod:`semgov.audit.fleet`)."""
    found: list[Worker] = []
    ids: list[tuple[bytes, bytes]] = []
    ranges = []
    for name, d in logs:
        witnessed, missing = witnessed_notes(d, list(witnesses)) if witnesses else ([], [])
        v, r = verify_log_checks(
            d, public_key=public_key, keyring=keyring, workers=workers,
            allow_unanchored=allow_unanchored, witnessed=witnessed,
        )  # fmt: skip
        rep = v.report()
        rep.problems += [Problem(None, m) for m in missing]
        found.append(Worker(name, str(d), rep, _trees(v), [n.cp.size for n in v.history]))
        ids.append((b"".join(f.id_at for f in v.found), b"".join(f.id_hash for f in v.found)))
        ranges.append(r)
    shared = shared_ids(ids)
    leaves = [
        leaves_at(Path(w.path) / LOG_FILE, r, want) if want else {}
        for w, r, want in zip(found, ranges, shared, strict=True)
    ]
    problems = origin_problems(found) + fork_problems(found) + id_problems(found, leaves)
    return FleetReport(found, problems)
