"""A checkpoint witness (c2sp.org/tlog-witness ``add-checkpoint``): the decision, pure, no I/O.

The witness keeps, per origin, the latest checkpoint it cosigned (size and root). Given a new
checkpoint signed by a log key it trusts, the old size the submitter says it had and an RFC 6962
consistency proof from that size, :func:`add_checkpoint` returns the new state and a cosignature
(:mod:`semgov.audit.cosign`), or raises :class:`WitnessError` with the status the spec gives:

- 403: no signature by a trusted log key (signatures by unknown keys are ignored);
- 400: the old size is larger than the checkpoint's;
- 409: the old size is not the size the witness last cosigned (``current`` says which: the
  submitter retries from it), or the same size with another root (a fork);
- 422: the consistency proof does not verify (a fork, or a rewritten log).

It never cosigns a checkpoint smaller than the one it holds (a rollback: 409) and never one it
cannot prove consistent with it. A first checkpoint of an unknown origin is taken on first use
(old size 0, empty proof): the caller decides which origins to accept (``known_only``).
"""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov.audit.cosign import cosign, split_note
from semgov.audit.keyring import AuditKeyring
from semgov.audit.merkle import ProofError, verify_consistency
from semgov.audit.note import Checkpoint, NoteError, open_note, unverified_checkpoint

MAX_PROOF = 63  # hashes in a consistency proof (tlog-witness: at most 63 lines)


class WitnessError(Exception):
    """The witness refuses a checkpoint: ``status`` as c2sp.org/tlog-witness's add-checkpoint says."""

    def __init__(self, status: int, message: str, current: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.current = current  # 409 on a size mismatch: the size the witness holds


@dataclass(frozen=True)
class Seen:
    """What the witness holds for one origin: the latest checkpoint it cosigned."""

    origin: str
    size: int
    root: bytes
    time: int  # when it cosigned it (unix seconds)


def signed_by_trusted(note: bytes, ring: AuditKeyring) -> Checkpoint:
    """The checkpoint of ``note`` when a key of ``ring``, valid at its size, signed it; else 403."""
    try:
        cp, names = unverified_checkpoint(note)
    except NoteError as e:
        raise WitnessError(400, f"malformed checkpoint: {e}") from None
    for name in dict.fromkeys(names):
        key = ring.by_name(name)
        if key is None or not key.trusted_for_size(cp.size):
            continue
        try:
            open_note(note, name, key.public_key)
        except NoteError as e:
            raise WitnessError(403, f"checkpoint signature rejected: {e}") from None
        return cp
    raise WitnessError(
        403, f"no signature by a trusted log key valid at size {cp.size} (signed by {', '.join(names)})"
    )


def add_checkpoint(
    seen: Seen | None,
    note: bytes,
    old_size: int,
    proof: list[bytes],
    ring: AuditKeyring,
    *,
    name: str,
    key: Ed25519PrivateKey,
    now: int,
) -> tuple[Seen, bytes]:
    """Check ``note`` against what the witness saw of its origin; the new state and the cosignature line.

    ``seen``: the witness's state for the note's origin (None: never seen). Raises WitnessError.
    """
    cp = signed_by_trusted(note, ring)
    if seen is not None and seen.origin != cp.origin:
        raise ValueError("the state given is of another origin")
    if seen is not None and cp.size < seen.size:
        raise WitnessError(
            409, f"rollback: size {cp.size} is smaller than the size {seen.size} it cosigned", seen.size
        )
    if old_size > cp.size:
        raise WitnessError(400, f"old size {old_size} is larger than the checkpoint's size {cp.size}")
    held = seen.size if seen is not None else 0
    if old_size != held:
        raise WitnessError(409, f"old size {old_size} is not the size {held} the witness last cosigned", held)
    if len(proof) > MAX_PROOF:
        raise WitnessError(400, f"consistency proof has {len(proof)} hashes (at most {MAX_PROOF})")
    if seen is None or seen.size == 0:
        if proof:
            raise WitnessError(422, "a consistency proof from size 0 must be empty")
    elif seen.size == cp.size:
        if seen.root != cp.root:
            raise WitnessError(
                409, f"fork: size {cp.size} was cosigned with another root (a second history)", held
            )
    else:
        try:
            verify_consistency(seen.size, cp.size, seen.root, cp.root, proof)
        except ProofError as e:
            raise WitnessError(
                422, f"not consistent with the cosigned size {seen.size}: {e} (a fork or a rewritten log)"
            ) from None
    line = cosign(split_note(note)[0], name, key, now)
    return Seen(cp.origin, cp.size, cp.root, now), line
