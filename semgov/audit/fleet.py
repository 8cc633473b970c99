"""One audit view over many workers' logs: the checks across logs, pure, no I/O.

Each worker's log is verified on its own (:func:`semgov.audit.verify_dir.verify_log`); what no
single log can show is checked here, over what the per-log verification read:

- **origins**: two logs naming the same origin are an error (an origin names one log; a proof
  bundle is bound to it): a log copied to a second worker, or two workers configured alike;
- **forks**: two signed trees (checkpoints, seals, witnessed checkpoints) of one origin and one
  size with different roots, in any logs: the same log with two histories;
- **ids across logs**: a decision id or event id in two workers' logs (each is fresh per
  decision or event): a record copied from one log into another, or a replay;
- **cross-boundary reuse**, counted over all logs by ``stats`` and ``report`` (the per-log
  counts of allows whose donor was of another tenant or namespace, summed).

:func:`semgov.audit.fleet_dir.verify_fleet` reads the logs and calls these.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from semgov.audit._scan import brief, record_id
from semgov.audit.verify import Report

MAX_ID_LINES = 5  # ids in two logs named one by one (all are counted)


@dataclass(frozen=True)
class Tree:
    """A signed tree head a log holds: where, and what it claims."""

    where: str  # "checkpoint", "checkpoints/12.note", "seal for size 12", "cosignatures/12.ab.note"
    origin: str
    size: int
    root: bytes


@dataclass
class Worker:
    """One worker's log in the fleet view: its name, directory, origin and verdict."""

    name: str
    path: str  # the log directory
    report: Report
    trees: list[Tree] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)  # sizes of the checkpoints it kept

    @property
    def origin(self) -> str | None:
        if self.report.checkpoint is not None:
            return self.report.checkpoint.origin
        return self.trees[0].origin if self.trees else None

    @property
    def log_file(self) -> str:
        return f"{self.path}/records.log"


@dataclass
class FleetReport:
    """Every worker's report and the problems found across them."""

    workers: list[Worker]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(w.report.ok for w in self.workers)

    @property
    def structure_only(self) -> bool:
        return all(w.report.structure_only for w in self.workers)

    def total(self, name: str) -> int:
        """The sum of one integer field of the workers' reports (``records``, ``seals``, ...)."""
        return sum(int(getattr(w.report, name)) for w in self.workers)

    def first(self) -> str | None:
        """The first problem: a worker's (naming its log file), else one across workers."""
        for w in self.workers:
            p = w.report.first()
            if p is not None:
                return f"worker {w.name} ({w.log_file}): {p}"
        return self.problems[0] if self.problems else None


def origin_problems(workers: Sequence[Worker]) -> list[str]:
    """Two or more logs that name one origin."""
    by: dict[str, list[Worker]] = defaultdict(list)
    for w in workers:
        if w.origin is not None:
            by[w.origin].append(w)
    return [
        f"origin {o!r} is named by {len(ws)} logs: "
        + ", ".join(f"worker {w.name} ({w.path})" for w in ws)
        + ": an origin names one log (a log copied to another worker, or two workers given one origin)"
        for o, ws in sorted(by.items())
        if len(ws) > 1
    ]


def fork_problems(workers: Sequence[Worker]) -> list[str]:
    """Per origin, signed trees of one size with different roots in any of the logs: a fork, named at
    the first size where the histories differ (checkpoint files named before seals)."""
    by: dict[tuple[str, int], dict[bytes, list[str]]] = defaultdict(lambda: defaultdict(list))
    for w in workers:
        for t in sorted(w.trees, key=lambda t: t.where.startswith("records.log")):
            by[(t.origin, t.size)][t.root].append(f"worker {w.name} {w.path}/{t.where}")
    forked: dict[str, list[int]] = defaultdict(list)
    for (origin, size), roots in by.items():
        if len(roots) > 1:
            forked[origin].append(size)
    out = []
    for origin, sizes in sorted(forked.items()):
        size = min(sizes)
        roots = by[(origin, size)]
        sides = "; ".join(f"root {r.hex()[:16]}... in {', '.join(ws[:2])}" for r, ws in roots.items())
        out.append(
            f"fork: log {origin!r} has {len(roots)} different trees of size {size}: {sides} "
            f"({len(sizes)} sizes differ: two histories under one origin)"
        )
    return out


def shared_ids(id_hashes: Sequence[tuple[bytes, bytes]]) -> list[set[int]]:
    """Per worker, the record indexes whose id hash another worker's log also holds.

    ``id_hashes``: per worker, (record indexes as uint64 bytes, 8-byte id hashes, same order).
    """
    at = [np.frombuffer(a, dtype=np.uint64) for a, _ in id_hashes]
    hs = [np.frombuffer(h, dtype=np.uint64) for _, h in id_hashes]
    out: list[set[int]] = [set() for _ in id_hashes]
    if sum(len(h) for h in hs) < 2:
        return out
    owner = np.concatenate([np.full(len(h), i, dtype=np.int64) for i, h in enumerate(hs)])
    index = np.concatenate(at)
    hashes = np.concatenate(hs)
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    same = np.flatnonzero((ordered[1:] == ordered[:-1]) & (owner[order][1:] != owner[order][:-1]))
    for k in same:
        for j in (order[k], order[k + 1]):
            out[int(owner[j])].add(int(index[j]))
    return out


def id_problems(workers: Sequence[Worker], leaves: Sequence[dict[int, bytes]]) -> list[str]:
    """A decision or event id that records of two workers' logs carry (``leaves``: per worker, the
    records :func:`shared_ids` named)."""
    where: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)  # id -> (worker, index)
    for k, got in enumerate(leaves):
        for index in sorted(got):
            try:
                rid = record_id(json.loads(got[index]))
            except (ValueError, RecursionError):
                continue
            if rid is not None:
                where[rid].append((k, index))

    def name(k: int, index: int) -> str:
        return f"worker {workers[k].name} record {index} ({workers[k].log_file})"

    out = [
        f"{rid[0]} {brief(rid[1])} is in {len({k for k, _ in at})} workers' logs: "
        + "; ".join(name(k, i) for k, i in at)
        + " (a record copied between logs, or a replay)"
        for rid, at in sorted(where.items(), key=lambda kv: kv[1])
        if len({k for k, _ in at}) > 1
    ]
    if len(out) > MAX_ID_LINES:
        out[MAX_ID_LINES:] = [f"... and {len(out) - MAX_ID_LINES} more ids in two workers' logs"]
    return out


@dataclass
class CrossCheck:
    """Reuse across boundaries over every worker's records, read in one pass (``stats``, ``report``).

    Counts per worker the live allows whose donor was of another tenant or namespace (as the
    record's ``cross_boundary`` names it), and finds what no single log shows: an allow whose
    donor's verified scope differs from the recipient's while its record names no boundary
    crossed, and a realization whose decision is an allow in *another* worker's log (a worker
    reuses only the KV it holds: such a realization copied a donor it could not hold).
    """

    cross_allows: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    problems: list[str] = field(default_factory=list)
    _allowed: dict[str, str] = field(default_factory=dict)  # decision id -> worker
    _realized: list[tuple[str, int, str]] = field(default_factory=list)  # worker, index, decision id

    def add(self, worker: str, index: int, rec: dict[str, object]) -> None:
        schema = rec.get("schema")
        if not isinstance(schema, str):
            return
        if schema.startswith("semgov.decision/") and rec.get("decision") == "allow":
            did = rec.get("decision_id")
            if isinstance(did, str):
                self._allowed.setdefault(did, worker)
            crossed = rec.get("cross_boundary")
            if crossed:
                self.cross_allows[worker] += 1
            donor = (rec.get("donor_tenant"), rec.get("donor_namespace"))
            if donor[0] is not None and donor != (rec.get("tenant"), rec.get("namespace")) and not crossed:
                self.problems.append(
                    f"worker {worker} record {index}: allow {brief(did)} reuses a donor of tenant "
                    f"{brief(donor[0])} namespace {brief(donor[1])} for tenant {brief(rec.get('tenant'))} "
                    f"namespace {brief(rec.get('namespace'))} and names no boundary crossed"
                )
        elif schema.startswith("semgov.engine_event/") and rec.get("kind") == "realization":
            did = rec.get("decision_id")
            if isinstance(did, str):
                self._realized.append((worker, index, did))

    def finish(self) -> list[str]:
        """The problems, once every worker's records were added."""
        out = list(self.problems)
        for worker, index, did in self._realized:
            owner = self._allowed.get(did)
            if owner is not None and owner != worker:
                out.append(
                    f"worker {worker} record {index}: realization of decision {brief(did)}, an allow in "
                    f"worker {owner}'s log: KV crossed workers"
                )
        return out
