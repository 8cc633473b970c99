"""The checks of audit log verification, and offline proof bundles: pure, no file or process I/O.

:func:`~semgov.audit.verify_dir.verify_log` reads a log directory (its frames checked in worker
processes by :mod:`semgov.audit._scan`) and runs the whole-log checks here (:class:`LogChecks`):
it recomputes the tree, checks every seal and the latest and every older signed checkpoint
against it, checks who signed what against each key's validity, finds decision and event ids
that repeat, and, given a checkpoint a reviewer kept, proves the log still extends it.

Keys come from an :class:`~semgov.audit.keyring.AuditKeyring` (or one public key, valid for
everything): a record is trusted only when signed by a key valid for its index, a seal or
checkpoint only when signed by a key valid at its size, and nothing signed by a revoked key is.
The report says who signed what (:attr:`Report.keys`), what each revoked key affects
(:attr:`Report.revoked`: exactly which records it signed, which checkpoints and seals only it
signed, which records only it anchors), and how many records no trusted seal or checkpoint
anchors (records after the last one: a crash mid-write or someone else's frames). Without keys
it checks the structure only (:attr:`Report.structure_only`).

Proof bundles (``semgov.audit_proof/v1``) carry one record, its inclusion proof and the signed
checkpoint it is proved against (:func:`proof_bundle`; made from a log directory by
:func:`~semgov.audit.verify_dir.make_bundle`); :func:`verify_bundle` checks one with no access
to the log.
"""

# NOTE: long module: the whole-log checks are one class (LogChecks) over one parsed log, and a
# verdict's rules read best side by side; the proof-bundle functions at the end share its helpers.

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from semgov.audit._scan import Found, SealSeen, brief, inspect_record, record_id
from semgov.audit.keyring import AuditKey, AuditKeyring
from semgov.audit.merkle import (
    EMPTY_ROOT,
    Frontier,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    verify_consistency,
    verify_inclusion,
)
from semgov.audit.note import Checkpoint, NoteError, open_note, unverified_checkpoint
from semgov.audit.recovery_record import RECOVERY_SCHEMA
from semgov.audit.recovery_record import describe as describe_recovery
from semgov.signing.keys import key_id_for
from semgov.wire import strictjson
from semgov.wire.models import DECISION_SCHEMAS, SHADOW_DECISION_SCHEMA

BUNDLE_SCHEMA = "semgov.audit_proof/v1"
_MAX_SIZE = 2**64 - 1  # tree sizes are uint64 (checkpoints, RFC 9162)
_MAX_PROOF = 64  # an inclusion path in a tree of at most 2^64 leaves
_HEX_HASH = re.compile(r"[0-9a-f]{64}")
_brief = brief


@dataclass(frozen=True)
class Problem:
    """One finding: the record index it concerns (when it concerns one) and why.

    ``exact`` False: the problem lies somewhere in records ``index..end`` (a checkpoint range).
    ``named``: the message names its records itself. ``secondary``: a consequence of other
    findings (records left unanchored), never the headline while another problem exists.
    """

    index: int | None
    message: str
    exact: bool = True
    end: int | None = None
    named: bool = False
    secondary: bool = False

    def __str__(self) -> str:
        if self.index is None or self.named:
            return self.message
        return (
            f"record {self.index}: {self.message}"
            if self.exact
            else f"from record {self.index}: {self.message}"
        )


@dataclass
class KeyUse:
    """What one key signed in the log (its signatures verified)."""

    records: list[tuple[int, int]] = field(default_factory=list)  # [start, end) spans of record indexes
    seals: int = 0
    seal_sizes: tuple[int, int] | None = None  # smallest and largest tree size sealed
    checkpoints: list[int] = field(default_factory=list)  # tree sizes


@dataclass
class RevokedImpact:
    """Exactly what a revoked key affects: nothing it signed is trusted any more."""

    records: list[tuple[int, int]] = field(default_factory=list)  # [start, end) spans it signed
    checkpoints: list[int] = field(default_factory=list)  # sizes of checkpoints signed only by it
    seals: int = 0  # seals signed only by it
    seal_sizes: tuple[int, int] | None = None
    anchored_only: tuple[int, int] | None = None  # [start, end): records only its seals or checkpoints anchor


@dataclass
class Report:
    records: int = 0
    root: bytes = b""
    checkpoint: Checkpoint | None = None
    checkpoints_checked: int = 0
    signatures_checked: int = 0  # record signatures
    seals: int = 0
    seals_checked: int = 0  # seal signatures
    anchored: int = 0  # records covered by a seal or checkpoint signed by a trusted key
    structure_only: bool = False  # no key: no signature was checked
    kept: Checkpoint | None = None
    keys: dict[str, KeyUse] = field(default_factory=dict)
    revoked: dict[str, RevokedImpact] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # (index, one line) of every recovery record (semgov.audit_recovery/v1): what a recovery cut
    recoveries: list[tuple[int, str]] = field(default_factory=list)
    witnessed: list[int] = field(default_factory=list)  # sizes of the witnessed checkpoints checked

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def unanchored(self) -> int:
        return self.records - self.anchored

    def first(self) -> Problem | None:
        """The earliest problem by record index; a range gives way to an exact problem inside it."""
        pool = [p for p in self.problems if not p.secondary] or self.problems
        named = sorted((p for p in pool if p.index is not None), key=lambda p: p.index or 0)
        if not named:
            return pool[0] if pool else None
        head = named[0]
        if not head.exact:
            lo = head.index or 0
            hi = head.end if head.end is not None else lo
            inside = [p for p in named if p.exact and lo <= (p.index or 0) <= hi]
            if inside:
                return inside[0]
        return head


def record_problem(leaf: bytes, public_key: Ed25519PublicKey, key_id: str) -> str | None:
    """Why ``leaf`` is not a canonical decision record or engine event signed by ``public_key``, or None.

    Never raises for any ``leaf`` (this runs on every record of a log, hostile ones included).
    """
    return inspect_record(leaf, {key_id: public_key}, key_id)[0]


def _count_words(start: int, end: int) -> str:
    n = end - start
    return f"1 record ({start}) is" if n == 1 else f"{n} records ({start}..{end - 1}) are"


# ---- notes (seals and checkpoints) ------------------------------------------------------------------


def _open_with(note: bytes, ring: AuditKeyring) -> tuple[Checkpoint, list[str], list[str]]:
    """The checkpoint of ``note``, the ids of the keyring keys whose signatures verify, the unknown names.

    NoteError when the note is malformed, a keyring key's signature on it does not verify, or no
    keyring key signed it.
    """
    cp, names = unverified_checkpoint(note)
    signers: list[str] = []
    unknown: list[str] = []
    for name in dict.fromkeys(names):
        entry = ring.by_name(name)
        if entry is None:
            unknown.append(name)
            continue
        open_note(note, name, entry.public_key)
        signers.append(entry.key_id)
    if not signers:
        raise NoteError(f"no signature by a key in the keyring (signed by {', '.join(unknown) or 'no key'})")
    return cp, signers, unknown


@dataclass(frozen=True)
class _Note:
    """A checkpoint note read from the directory: where, what tree, who signed it."""

    name: str  # "latest checkpoint" or "checkpoint <size>.note"
    cp: Checkpoint
    signers: tuple[str, ...]


def _trust_problems(ring: AuditKeyring, signers: Iterable[str], size: int) -> tuple[bool, list[str]]:
    """Whether a signer is trusted at tree ``size``, and why each other signer is not."""
    trusted, why = False, []
    for kid in signers:
        key = ring.get(kid)
        if key is None:
            continue
        if key.trusted_for_size(size):
            trusted = True
        elif key.revoked:
            why.append(f"signed by revoked key {kid}")
        elif "checkpoints" not in key.signs:
            why.append(f"signed by key {kid}, which may not sign checkpoints (signs: records)")
        else:
            why.append(f"signed by key {kid} outside its validity ({key.validity()})")
    return trusted, why


def _roots_at(hashes: Sequence[bytes], sizes: Iterable[int]) -> dict[int, bytes]:
    """The Merkle root of the first ``s`` leaves for every ``s`` in ``sizes`` (one pass, O(n))."""
    want = sorted({s for s in sizes if 0 <= s <= len(hashes)})
    out: dict[int, bytes] = {}
    fr = Frontier()
    k = 0
    if want and want[0] == 0:
        out[0] = EMPTY_ROOT
        k = 1
    for i, h in enumerate(hashes, start=1):
        if k >= len(want):
            break
        fr.append(h)
        if want[k] == i:
            out[i] = fr.root()
            k += 1
    return out


# ---- the log ----------------------------------------------------------------------------------


class LogChecks:
    """The parent side of :func:`~semgov.audit.verify_dir.verify_log`: everything that needs the whole log.

    Fed what was read from the log (:meth:`add_ranges`, :meth:`add_checkpoints`), then checked:
    :meth:`check_tree`, :meth:`check_records`, :meth:`check_anchoring`, and
    :meth:`check_duplicates` with the records :meth:`duplicates_to_read` names; :meth:`report`.
    """

    def __init__(self, ring: AuditKeyring | None) -> None:
        self.ring = ring
        self.rep = Report(structure_only=ring is None)
        self.hashes: list[bytes] = []
        self.found: list[Found] = []
        self.seals: list[SealSeen] = []
        self.history: list[_Note] = []  # checkpoints/<size>.note, by size
        self.latest: _Note | None = None
        self.kept: _Note | None = None
        self.witnessed: list[_Note] = []  # checkpoints a witness cosigned (cosignatures checked)
        self.roots: dict[int, bytes] = {}
        # (size, signers) of every seal and checkpoint whose tree matches the records
        self.anchors: list[tuple[int, tuple[str, ...]]] = []

    def report(self) -> Report:
        """The report, its problems sorted by record index (those about no one record last)."""
        self.rep.problems.sort(key=lambda p: (p.index is None, p.index or 0))
        return self.rep

    # -- frames --------------------------------------------------------------------------------

    def add_ranges(self, found: list[Found], scan_problem: tuple[int, str] | None) -> None:
        """What every range of frames holds, in order, and the problem that stopped the split, if any."""
        self.found = found
        rep = self.rep
        for f in self.found:
            self.hashes += [f.leaves[i : i + 32] for i in range(0, len(f.leaves), 32)]
            rep.problems += [Problem(i, why) for i, why in f.problems]
            self.seals += f.seals
        if scan_problem is not None:
            rep.problems.append(Problem(*scan_problem))
        rep.records = len(self.hashes)
        rep.seals = len(self.seals)
        if self.ring is None:
            rep.notes.append("no signature checked (no key given): structure only")
        else:
            rep.signatures_checked = rep.records
            rep.seals_checked = rep.seals

    # -- checkpoints ---------------------------------------------------------------------------

    def _note(self, data: bytes, what: str) -> _Note | None:
        try:
            if self.ring is None:
                cp, _ = unverified_checkpoint(data)
                signers: Sequence[str] = ()
            else:
                cp, signers, _ = _open_with(data, self.ring)
        except NoteError as e:
            self.rep.problems.append(Problem(None, f"{what} rejected: {e}"))
            return None
        return _Note(what, cp, tuple(signers))

    def add_checkpoints(
        self, latest: bytes | None, numbered: Iterable[tuple[str, bytes | OSError]], kept: bytes | None
    ) -> None:
        """The latest checkpoint, every older one the log kept, and the reviewer's, signatures checked.

        ``numbered``: ``(file name, its bytes or why it could not be read)`` of every
        ``checkpoints/<size>.note``, by size.
        """
        rep = self.rep
        if latest is None:
            rep.notes.append("no checkpoint yet")
        else:
            self.latest = self._note(latest, "latest checkpoint")
            rep.checkpoint = self.latest.cp if self.latest is not None else None
        for name, data in numbered:
            if isinstance(data, OSError):
                rep.problems.append(Problem(None, f"checkpoint {name} rejected: {data.strerror}"))
                continue
            n = self._note(data, f"checkpoint {name}")
            if n is not None and n.cp.size != int(name[:-5]):
                rep.problems.append(
                    Problem(None, f"checkpoint {name} holds a checkpoint of size {n.cp.size}")
                )
            elif n is not None:
                self.history.append(n)
        # NOTE: the latest checkpoint is also kept as checkpoints/<size>.note: count it once.
        kept_too = self.latest is not None and any(
            n.cp == self.latest.cp and n.signers == self.latest.signers for n in self.history
        )
        rep.checkpoints_checked = len(self.history) + (latest is not None and not kept_too)
        if kept is not None and self.ring is None:
            rep.problems.append(
                Problem(None, "a kept checkpoint can only be checked with --pubkey or --keyring")
            )
        elif kept is not None:
            self.kept = self._note(kept, "kept checkpoint")
            rep.kept = self.kept.cp if self.kept is not None else None

    def add_witnessed(self, notes: Iterable[tuple[str, bytes | str]]) -> None:
        """Checkpoints a witness cosigned: ``(file, the note, or why its cosignature was refused)``;
        each must be signed by a trusted log key and be a tree the log still holds."""
        for name, data in notes:
            if isinstance(data, str):
                self.rep.problems.append(Problem(None, f"witnessed checkpoint {name} rejected: {data}"))
                continue
            n = self._note(data, f"witnessed checkpoint {name}")
            if n is not None:
                self.witnessed.append(n)
                self.rep.witnessed.append(n.cp.size)

    # -- the tree: seals and checkpoints against the records --------------------------------------------

    def check_tree(self) -> None:
        notes = [n for n in (self.latest, self.kept, *self.history, *self.witnessed) if n is not None]
        sizes = [len(self.hashes), *(s.size for s in self.seals), *(n.cp.size for n in notes)]
        self.roots = _roots_at(self.hashes, sizes)
        self.rep.root = self.roots[len(self.hashes)]
        self._check_seals()
        self._check_checkpoints()
        if self.kept is not None:
            self._check_kept(self.kept)
        for n in self.witnessed:
            origin = self._origin()
            if origin is not None and n.cp.origin != origin:
                self.rep.problems.append(Problem(None, f"{n.name} is of another log ({n.cp.origin!r})"))
                continue
            p = self._prefix_problem(n.cp, n.name)
            if p is not None:
                self.rep.problems.append(
                    Problem(p.index, p.message + " (the witness saw another history: a fork)")
                )

    def _origin(self) -> str | None:
        if self.latest is not None:
            return self.latest.cp.origin
        return self.seals[0].origin if self.seals else None

    def _check_seals(self) -> None:
        """Each seal: in order, of this log, over the records before it, by a trusted key."""
        origin, prev, rep = self._origin(), -1, self.rep
        untrusted: dict[str, list[int]] = defaultdict(list)  # why -> seal sizes
        for s in self.seals:
            where = f"seal for size {s.size} at byte offset {s.offset}"
            if s.size <= prev:
                rep.problems.append(
                    Problem(None, f"{where} repeats or goes back from the seal for size {prev}")
                )
                continue
            if origin is not None and s.origin != origin:
                rep.problems.append(Problem(None, f"{where} names another log ({s.origin!r})"))
                continue
            if self.roots.get(s.size) != s.root:
                lo = max(prev, 0)
                why = (
                    f"{where} does not match the records before it: records {lo}..{s.size - 1} were altered, "
                )
                rep.problems.append(
                    Problem(
                        lo, why + "or it seals another tree (a fork)", exact=False, end=s.size - 1, named=True
                    )
                )
                continue
            prev = s.size
            self.anchors.append((s.size, s.signers))
            for kid in s.signers:
                use = self._use(kid)
                use.seals += 1
                use.seal_sizes = (use.seal_sizes[0] if use.seal_sizes else s.size, s.size)
            self._seal_trust(s, untrusted)
        for why, sizes in untrusted.items():
            n = len(sizes)
            what = (
                f"the seal for size {sizes[0]} is"
                if n == 1
                else f"{n} seals (sizes {sizes[0]}..{sizes[-1]}) are"
            )
            rep.problems.append(Problem(None, f"{what} {why}"))

    def _seal_trust(self, s: SealSeen, untrusted: dict[str, list[int]]) -> None:
        ring = self.ring
        if ring is None:
            return
        if not s.signers:
            untrusted[
                f"signed by no key in the keyring (signed by {', '.join(s.unknown) or 'no key'})"
            ].append(s.size)
            return
        trusted, why = _trust_problems(ring, s.signers, s.size)
        if trusted:
            return
        keys = [k for k in (ring.get(kid) for kid in s.signers) if k is not None]
        if all(k.revoked for k in keys):  # not a problem of its own: what it leaves unanchored is
            for k in keys:
                impact = self._impact(k.key_id)
                impact.seals += 1
                impact.seal_sizes = (impact.seal_sizes[0] if impact.seal_sizes else s.size, s.size)
            return
        for w in why:
            if not w.startswith("signed by revoked"):
                untrusted[w].append(s.size)

    def _prefix_problem(self, cp: Checkpoint, what: str) -> Problem | None:
        n = len(self.hashes)
        if cp.size > n:
            return Problem(n, f"log truncated: it has {n} records but the {what} covers {cp.size}; "
                              f"records {n}..{cp.size - 1} are missing")  # fmt: skip
        if self.roots.get(cp.size) != cp.root:
            return Problem(None, f"the first {cp.size} records do not hash to the {what}'s root: "
                                 "records were altered, removed, inserted or reordered")  # fmt: skip
        return None

    def _check_checkpoints(self) -> None:
        """Older checkpoints localise a mismatch to the records between two of them; then the latest."""
        rep, prev = self.rep, 0
        latest = self.latest
        for n in self.history:
            size = n.cp.size
            if latest is not None and n.cp.origin != latest.cp.origin:
                rep.problems.append(
                    Problem(None, f"checkpoint of size {size} names another log {n.cp.origin!r}")
                )
            self._checkpoint_trust(n)
            p = self._prefix_problem(n.cp, f"checkpoint of size {size}")
            if p is not None:
                if p.index is None:
                    p = Problem(
                        prev,
                        f"{p.message} (between records {prev} and {size - 1})",
                        exact=False,
                        end=size - 1,
                    )
                rep.problems.append(p)
                break
            self.anchors.append((size, n.signers))
            prev = size
        if latest is None:
            return
        if not any(n.cp == latest.cp and n.signers == latest.signers for n in self.history):
            self._checkpoint_trust(latest)
        p = self._prefix_problem(latest.cp, "latest checkpoint")
        if p is None:
            self.anchors.append((latest.cp.size, latest.signers))
        elif not any(q.message == p.message for q in rep.problems):
            end = latest.cp.size - 1
            rep.problems.append(p if p.index is not None else Problem(prev, p.message, exact=False, end=end))

    def _checkpoint_trust(self, n: _Note) -> None:
        for kid in n.signers:
            if n.cp.size not in self._use(kid).checkpoints:
                self._use(kid).checkpoints.append(n.cp.size)
        if self.ring is None:
            return
        trusted, why = _trust_problems(self.ring, n.signers, n.cp.size)
        if trusted:
            return
        self.rep.problems += [Problem(None, f"{n.name}: {w}") for w in why]
        revoked = [k for k in n.signers if (key := self.ring.get(k)) is not None and key.revoked]
        if len(revoked) == len(n.signers):
            for kid in revoked:
                if n.cp.size not in self._impact(kid).checkpoints:
                    self._impact(kid).checkpoints.append(n.cp.size)

    def _check_kept(self, kept: _Note) -> None:
        rep, latest = self.rep, self.rep.checkpoint
        assert self.ring is not None  # a kept checkpoint is only read with keys
        trusted, why = _trust_problems(self.ring, kept.signers, kept.cp.size)
        if not trusted:
            rep.problems += [Problem(None, f"kept checkpoint: {w}") for w in why]
            return
        if latest is not None and kept.cp.origin != latest.origin:
            rep.problems.append(Problem(None, f"kept checkpoint is for another log ({kept.cp.origin!r})"))
            return
        p = self._prefix_problem(kept.cp, "kept checkpoint")
        if p is not None:
            rep.problems.append(p)
            return
        if latest is not None and latest.size >= kept.cp.size:
            try:
                proof = consistency_proof(kept.cp.size, latest.size, self.hashes)
                verify_consistency(kept.cp.size, latest.size, kept.cp.root, latest.root, proof)
                how = (
                    f"a consistency proof of {len(proof)} hashes verified"
                    if proof
                    else "the same tree (nothing to prove)"
                )
                rep.notes.append(
                    f"kept checkpoint (size {kept.cp.size}) is consistent with the latest "
                    f"(size {latest.size}): {how}"
                )
            except ProofError as e:
                rep.problems.append(Problem(None, f"kept checkpoint is not consistent with the latest: {e}"))
        elif latest is not None:
            rep.problems.append(
                Problem(
                    latest.size,
                    f"latest checkpoint (size {latest.size}) is older than the kept one ({kept.cp.size})",
                )
            )

    # -- records, anchoring, ids ----------------------------------------------------------------------

    def _use(self, kid: str) -> KeyUse:
        return self.rep.keys.setdefault(kid, KeyUse())

    def _impact(self, kid: str) -> RevokedImpact:
        return self.rep.revoked.setdefault(kid, RevokedImpact())

    def check_records(self) -> None:
        """Who signed which records, against each key's validity, role and revocation."""
        if self.ring is None:
            return
        spans: list[tuple[int, int, str]] = []
        for f in self.found:
            for a, b, kid in f.spans:
                if spans and spans[-1][1] == a and spans[-1][2] == kid:
                    spans[-1] = (spans[-1][0], b, kid)
                else:
                    spans.append((a, b, kid))
        for a, b, kid in spans:
            key = self.ring.get(kid)
            assert key is not None  # the worker verified the signature with this key
            self._use(kid).records.append((a, b))
            for lo, hi, why in _record_span_problems(key, a, b):
                self.rep.problems.append(_span_problem(lo, hi, why))
            if key.revoked:
                self._impact(kid).records.append((a, b))

    def check_anchoring(self, allow: bool) -> None:
        """How far a seal or checkpoint by a trusted key anchors the log; what only revoked keys anchor."""
        rep, ring = self.rep, self.ring

        def trusted(size: int, signers: tuple[str, ...]) -> bool:
            if ring is None:
                return True  # structure only: a seal or checkpoint whose tree matches
            return any((k := ring.get(kid)) is not None and k.trusted_for_size(size) for kid in signers)

        rep.anchored = max((s for s, signers in self.anchors if trusted(s, signers)), default=0)
        for kid in rep.revoked:
            only = max((s for s, signers in self.anchors if kid in signers), default=0)
            if only > rep.anchored:
                rep.revoked[kid].anchored_only = (rep.anchored, only)
        if rep.records <= rep.anchored:
            return
        by = "any signature" if ring is not None else "any seal or checkpoint"
        msg = (
            f"{_count_words(rep.anchored, rep.records)} not anchored by {by}: no seal or checkpoint by "
            "a trusted key covers them (appended after the last seal: a crash mid-write, or someone else's "
            "frames)"
        )
        if allow:
            rep.notes.append(msg)
        else:
            rep.problems.append(
                Problem(rep.anchored, msg, exact=False, end=rep.records - 1, named=True, secondary=True)
            )

    def recoveries_to_read(self) -> set[int]:
        """The indexes of the records that may be recovery records (to read for :meth:`add_recoveries`)."""
        return {i for f in self.found for i in f.recoveries}

    def add_recoveries(self, leaves: dict[int, bytes]) -> None:
        """Name every recovery record (``leaves``: the records :meth:`recoveries_to_read` named)."""
        for index in sorted(leaves):
            try:
                rec = json.loads(leaves[index])
            except (ValueError, RecursionError):
                continue
            if isinstance(rec, dict) and rec.get("schema") == RECOVERY_SCHEMA:
                self.rep.recoveries.append((index, describe_recovery(rec)))

    def duplicates_to_read(self) -> set[int]:
        """The indexes of the records whose id hash repeats another's (the records to compare)."""
        at = np.frombuffer(b"".join(f.id_at for f in self.found), dtype=np.uint64)
        hashes = np.frombuffer(b"".join(f.id_hash for f in self.found), dtype=np.uint64)
        if len(hashes) < 2:
            return set()
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        same = np.flatnonzero(ordered[1:] == ordered[:-1])
        if not len(same):
            return set()
        return {int(at[order[i]]) for i in same} | {int(at[order[i + 1]]) for i in same}

    def check_duplicates(self, leaves: dict[int, bytes]) -> None:
        """A decision_id or event_id that two records carry: an error naming both indexes.

        ``leaves``: the records :meth:`duplicates_to_read` named, by index.
        """
        first: dict[tuple[str, str], int] = {}
        for index in sorted(leaves):
            try:
                rid = record_id(json.loads(leaves[index]))
            except (ValueError, RecursionError):
                continue
            if rid is None:
                continue
            if rid in first:
                why = f"{rid[0]} {brief(rid[1])} repeats record {first[rid]}"
                self.rep.problems.append(Problem(index, why + " (a record logged twice, or a replay)"))
            else:
                first[rid] = index


def _record_span_problems(key: AuditKey, a: int, b: int) -> list[tuple[int, int, str]]:
    """Parts of records ``a..b-1`` (signed by ``key``) that the key may not vouch for, and why."""
    if key.revoked:
        return [(a, b, f"signed by revoked key {key.key_id}")]
    if "records" not in key.signs:
        return [(a, b, f"signed by key {key.key_id}, which may not sign records (signs: checkpoints)")]
    out = []
    why = f"signed by key {key.key_id} outside its validity ({key.validity()})"
    if a < key.not_before_size:
        out.append((a, min(b, key.not_before_size), why))
    if key.not_after_size is not None and b > key.not_after_size:
        out.append((max(a, key.not_after_size), b, why))
    return out


def _span_problem(lo: int, hi: int, why: str) -> Problem:
    if hi - lo == 1:
        return Problem(lo, why)
    verb = why.replace("signed by", "are signed by", 1)
    return Problem(lo, f"records {lo}..{hi - 1} {verb}", exact=False, end=hi - 1, named=True)


# ---- offline proof bundles --------------------------------------------------------------------


def is_decision_record(leaf: bytes, decision_id: str) -> bool:
    """Whether ``leaf`` is the live decision record ``decision_id`` (strict JSON; never raises)."""
    # NOTE: an engine event names its decision too; the bundle proves the decision record. A
    # shadow decision (semgov.shadow_decision/v1) was never acted on: it is not a decision here.
    return _decision_schema(leaf, decision_id) in DECISION_SCHEMAS


def is_shadow_record(leaf: bytes, decision_id: str) -> bool:
    """Whether ``leaf`` is the shadow decision record ``decision_id`` (strict JSON; never raises)."""
    return _decision_schema(leaf, decision_id) == SHADOW_DECISION_SCHEMA


def _decision_schema(leaf: bytes, decision_id: str) -> str | None:
    """The schema of ``leaf`` when it is a record whose ``decision_id`` is ``decision_id``, else None."""
    try:
        rec = strictjson.loads(leaf)
    except strictjson.StrictJSONError:
        return None  # not a record anyone can prove (`semgov audit verify` names it)
    if not isinstance(rec, dict) or rec.get("decision_id") != decision_id:
        return None
    schema = rec.get("schema")
    return schema if isinstance(schema, str) else None


def proof_bundle(
    note: bytes, tree_size: int, index: int, leaf: bytes, hashes: Sequence[bytes]
) -> dict[str, Any]:
    """The proof bundle of record ``index`` (``leaf``) of the tree of ``hashes``, against ``note``.

    ``note``: the signed checkpoint of that tree (``tree_size`` records).
    """
    return {
        "schema": BUNDLE_SCHEMA,
        "record": leaf.decode("utf-8"),
        "index": index,
        "tree_size": tree_size,
        "inclusion_proof": [h.hex() for h in inclusion_proof(index, hashes)],
        "checkpoint": note.decode("utf-8"),
    }


def _field(bundle: dict[str, Any], name: str) -> Any:
    try:
        return bundle[name]
    except KeyError:
        raise ProofError(f'malformed bundle: "{name}" is missing') from None


def _int_field(bundle: dict[str, Any], name: str, lo: int, hi: int) -> int:
    """``bundle[name]`` as a JSON integer in ``lo..hi`` (not a bool, not a float such as 4.9 or 1e400)."""
    v = _field(bundle, name)
    if not strictjson.is_int(v):
        raise ProofError(f'malformed bundle: "{name}" must be a JSON integer, got {_brief(v)}')
    n: int = v
    if not lo <= n <= hi:
        raise ProofError(f'malformed bundle: "{name}" {n} is out of range {lo}..{hi}')
    return n


def _text_field(bundle: dict[str, Any], name: str) -> bytes:
    v = _field(bundle, name)
    if not isinstance(v, str):
        raise ProofError(f'malformed bundle: "{name}" must be a JSON string, got {_brief(v)}')
    try:
        return v.encode("utf-8")
    except UnicodeEncodeError:
        raise ProofError(f'malformed bundle: "{name}" holds a lone surrogate (not valid Unicode)') from None


def read_bundle(data: bytes | str) -> Any:
    """Parse a proof bundle file as strict JSON (no duplicate keys, NaN, lone surrogates or deep nesting).

    Raises :class:`semgov.wire.strictjson.StrictJSONError` (a ValueError) saying what is wrong.
    """
    return strictjson.loads(data)


def bundle_origin(bundle: Any) -> str | None:
    """The origin (log name) a bundle's checkpoint names, unverified; None when it has none readable."""
    note = bundle.get("checkpoint") if isinstance(bundle, dict) else None
    if not isinstance(note, str):
        return None
    try:
        return unverified_checkpoint(note.encode("utf-8"))[0].origin
    except (NoteError, UnicodeEncodeError):
        return None


def verify_bundle(
    bundle: Any, key: Ed25519PublicKey | AuditKeyring, *, origin: str | None = None
) -> dict[str, Any]:
    """Check a proof bundle without the log; return its record (a decision, or an engine event;
    a hand-made bundle may carry a shadow decision, whose ``schema`` says so).

    ``bundle`` is the parsed document (see :func:`read_bundle`), or the file's bytes or text,
    parsed here strictly (only then can a duplicate key be seen). Every field must have its
    exact type: ``index`` and ``tree_size`` JSON integers in range (not ``4.9``, ``1e400`` or
    ``false``), the proof a list of 64 lower-case hex digits each. ``key``: one public key, or a
    keyring (after a rotation the record and the checkpoint may be signed by different keys;
    each must be valid where it signs, and not revoked). ``origin``: the log the record must be
    in (its checkpoints' origin line): a bundle from any other log is refused, however well it
    verifies; None checks no origin (the caller then says which log it proved, e.g. with
    :func:`bundle_origin`: ``semgov audit verify-proof`` prints it). Raises ProofError.
    """
    if isinstance(bundle, bytes | str):
        try:
            bundle = read_bundle(bundle)
        except strictjson.StrictJSONError as e:
            raise ProofError(f"malformed bundle: {e}") from None
    if not isinstance(bundle, dict) or bundle.get("schema") != BUNDLE_SCHEMA:
        raise ProofError(f"not a {BUNDLE_SCHEMA} bundle")
    leaf = _text_field(bundle, "record")
    size = _int_field(bundle, "tree_size", 1, _MAX_SIZE)
    index = _int_field(bundle, "index", 0, size - 1)
    hashes = _field(bundle, "inclusion_proof")
    if not isinstance(hashes, list):
        raise ProofError(f'malformed bundle: "inclusion_proof" must be a JSON array, got {_brief(hashes)}')
    if len(hashes) > _MAX_PROOF:
        raise ProofError(
            f'malformed bundle: "inclusion_proof" has {len(hashes)} hashes (at most {_MAX_PROOF})'
        )
    for i, h in enumerate(hashes):
        if not isinstance(h, str) or not _HEX_HASH.fullmatch(h):
            raise ProofError(
                f'malformed bundle: "inclusion_proof"[{i}] must be 64 lower-case hex digits, got {_brief(h)}'
            )
    proof = [bytes.fromhex(h) for h in hashes]
    note = _text_field(bundle, "checkpoint")
    ring = key if isinstance(key, AuditKeyring) else AuditKeyring.single(key)
    expected = None if isinstance(key, AuditKeyring) else key_id_for(key)
    try:
        cp, signers, _ = _open_with(note, ring)
    except NoteError as e:
        raise ProofError(f"checkpoint rejected: {e}") from e
    trusted, why_not = _trust_problems(ring, signers, cp.size)
    if not trusted:
        raise ProofError(f"checkpoint rejected: {'; '.join(why_not)}")
    if origin is not None and cp.origin != origin:
        raise ProofError(
            f"checkpoint rejected: it is of log {cp.origin!r}, not the expected {origin!r} "
            "(a proof from another log)"
        )
    if cp.size != size:
        raise ProofError(f"bundle says tree size {size}, its checkpoint says {cp.size}")
    verify_inclusion(index, size, leaf_hash(leaf), proof, cp.root)
    keys = {k.key_id: k.public_key for k in ring}
    why, kid, _ = inspect_record(leaf, keys, expected)
    signer = ring.get(kid) if kid is not None else None
    if why is None and signer is not None:
        why = next((w for _, _, w in _record_span_problems(signer, index, index + 1)), None)
    if why is not None:
        raise ProofError(f"record {index}: {why}")
    rec: dict[str, Any] = json.loads(leaf)
    return rec


def verify_leaf(leaf: bytes, keys: dict[str, Ed25519PublicKey]) -> str | None:
    """Why one record, as a log holds it, is not a canonical signed record (decision, shadow
    decision or engine event) of a key in ``keys`` (by the record's own ``key_id``); None when it
    is one. Never raises (pure, for readers that follow a log: ``semgov calibrate``)."""
    why, _, _ = inspect_record(leaf, keys, None)
    return why
