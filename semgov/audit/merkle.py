"""RFC 6962 / RFC 9162 Merkle tree hashing with SHA-256: roots, an incremental frontier, proofs.

Definitions (RFC 9162 section 2.1.1)::

    leaf hash      = SHA-256(0x00 || data)
    interior node  = SHA-256(0x01 || left || right)
    MTH({})        = SHA-256("")
    MTH({d0})      = leaf hash of d0
    MTH(D[n])      = node(MTH(D[0:k]), MTH(D[k:n]))   k = largest power of two < n

Everything below except :func:`leaf_hash` works on *leaf hashes* (32 bytes each), never on leaf
data. Leaf indices count from 0 and tree sizes are leaf counts. Proofs are lists of 32-byte
hashes in the order RFC 9162 defines (the leaf's sibling first, the root's child last).

Failed verifications raise :class:`ProofError`; so do proof requests for sizes or indices out
of range. This module does no I/O.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()
_MAX_SIZE = 2**64 - 1  # sizes travel as uint64 in checkpoints and in RFC 9162 structures
_LEAF_PREFIX = b"\x00"
_NODE_PREFIX = b"\x01"
_HEX_HASH = re.compile(r"[0-9a-f]{64}")

_sha256 = hashlib.sha256


class ProofError(Exception):
    """A proof does not verify, or a proof was asked for with sizes or an index out of range."""


def leaf_hash(data: bytes) -> bytes:
    """SHA-256(0x00 || data): the hash of one leaf (RFC 9162 section 2.1.1)."""
    return _sha256(_LEAF_PREFIX + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right): the hash of an interior node."""
    return _sha256(_NODE_PREFIX + left + right).digest()


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """MTH over ``leaf_hashes`` (already leaf-hashed); :data:`EMPTY_ROOT` for no leaves. O(n)."""
    _check_leaf_hashes(leaf_hashes, len(leaf_hashes))
    if not leaf_hashes:
        return EMPTY_ROOT
    return _mth(leaf_hashes, 0, len(leaf_hashes))


def _mth(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    """MTH(leaves[lo:hi]) for hi > lo, iteratively, level by level.

    NOTE: pairing neighbours level by level and carrying an unpaired last node up unchanged
    builds exactly the RFC's left-balanced tree. With k the largest power of two below n, at
    each level j < log2(k) the left part D[0:k] is an even count (k / 2^j) of whole subtrees,
    so no pair crosses the split, while D[k:n] (n - k <= k) shrinks to one node within log2(k)
    levels and then rides up unchanged; the last level is node(MTH(D[0:k]), MTH(D[k:n])).
    """
    level = leaves[lo:hi]
    prefix = _NODE_PREFIX
    sha = _sha256
    while len(level) > 1:
        pairs = iter(level)
        nxt = [sha(prefix + a + b).digest() for a, b in zip(pairs, pairs, strict=False)]
        if len(level) & 1:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _split(n: int) -> int:
    """The largest power of two strictly less than ``n`` (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


def _check_size(value: object, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProofError(f"{what} must be an integer, got {type(value).__name__}")
    if not 0 <= value <= _MAX_SIZE:
        raise ProofError(f"{what} {value} is out of range 0..2^64-1")
    return value


def _check_hash(value: object, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) != HASH_SIZE:
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise ProofError(f"{what} must be {HASH_SIZE} bytes, got {got}")
    return value


def _check_leaf_hashes(leaf_hashes: Sequence[bytes], upto: int) -> None:
    # One linear pass (about 3% of hashing the tree): a short or long "hash" would otherwise
    # give a well-formed but meaningless root.
    for i in range(upto):
        h = leaf_hashes[i]
        if not isinstance(h, bytes) or len(h) != HASH_SIZE:
            _check_hash(h, f"leaf hash {i}")


class Frontier:
    """An append-only Merkle tree kept as its frontier: O(log n) memory, appends and roots.

    NOTE: invariants. ``_hashes`` holds the roots of the perfect subtrees of the binary
    decomposition of ``_size``, left to right, largest first: for size 13 = 8 + 4 + 1 they are
    MTH(D[0:8]), MTH(D[8:12]), MTH(D[12:13]). So ``len(_hashes) == popcount(_size)``, and the
    i-th hash covers 2**b leaves where b is the i-th set bit of ``_size`` counted from the top.
    These are the same nodes as transparency-dev/merkle's compact range [0, size).
    """

    __slots__ = ("_hashes", "_size")

    def __init__(self) -> None:
        self._size = 0
        self._hashes: list[bytes] = []

    @property
    def size(self) -> int:
        """Number of leaves appended so far."""
        return self._size

    @property
    def hashes(self) -> tuple[bytes, ...]:
        """The perfect-subtree roots, left to right (see the class invariants)."""
        return tuple(self._hashes)

    def append(self, leaf_hash: bytes) -> None:
        """Append one leaf hash (32 bytes). Amortised O(1) node hashes."""
        _check_hash(leaf_hash, "leaf hash")
        if self._size >= _MAX_SIZE:
            raise ValueError("frontier is full (2^64-1 leaves)")
        hashes = self._hashes
        hashes.append(leaf_hash)
        # Each trailing 1 bit of the old size is a perfect subtree the same size as the one
        # being carried: merge them, as in binary addition of 1.
        s = self._size
        while s & 1:
            right = hashes.pop()
            hashes[-1] = _sha256(_NODE_PREFIX + hashes[-1] + right).digest()
            s >>= 1
        self._size += 1

    def root(self) -> bytes:
        """MTH of the leaves appended so far; :data:`EMPTY_ROOT` when empty. O(log n)."""
        if not self._hashes:
            return EMPTY_ROOT
        # MTH of a size with decomposition 2^a + 2^b + ... (a > b > ...) is
        # node(P_a, node(P_b, ...)): fold from the right.
        acc = self._hashes[-1]
        for h in reversed(self._hashes[:-1]):
            acc = _sha256(_NODE_PREFIX + h + acc).digest()
        return acc

    def copy(self) -> Frontier:
        """An independent frontier with the same state."""
        f = Frontier()
        f._size = self._size
        f._hashes = list(self._hashes)
        return f

    @classmethod
    def from_leaf_hashes(cls, leaf_hashes: Sequence[bytes]) -> Frontier:
        """The frontier of a tree holding ``leaf_hashes``, computed in one O(n) pass."""
        n = len(leaf_hashes)
        _check_leaf_hashes(leaf_hashes, n)
        f = cls()
        lo = 0
        for bit in range(n.bit_length() - 1, -1, -1):
            if n >> bit & 1:
                f._hashes.append(_mth(leaf_hashes, lo, lo + (1 << bit)))
                lo += 1 << bit
        f._size = n
        return f

    def to_json(self) -> dict[str, Any]:
        """``{"size": n, "hashes": [lowercase hex, ...]}``, for persisting the state."""
        return {"size": self._size, "hashes": [h.hex() for h in self._hashes]}

    @classmethod
    def from_json(cls, d: object) -> Frontier:
        """Inverse of :meth:`to_json`; raises ValueError saying what is wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"frontier: expected an object, got {type(d).__name__}")
        if set(d) != {"size", "hashes"}:
            raise ValueError(f"frontier: expected keys 'hashes' and 'size', got {sorted(map(str, d))}")
        size, hashes = d["size"], d["hashes"]
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= _MAX_SIZE:
            raise ValueError(f"frontier: size must be an integer in 0..2^64-1, got {size!r}")
        if not isinstance(hashes, list):
            raise ValueError(f"frontier: hashes must be a list, got {type(hashes).__name__}")
        want = size.bit_count()
        if len(hashes) != want:
            raise ValueError(
                f"frontier: size {size} needs {want} hashes (one per set bit), got {len(hashes)}"
            )
        raw: list[bytes] = []
        for i, h in enumerate(hashes):
            if not isinstance(h, str) or not _HEX_HASH.fullmatch(h):
                raise ValueError(f"frontier: hashes[{i}] must be 64 lowercase hex digits, got {h!r}")
            raw.append(bytes.fromhex(h))
        f = cls()
        f._size = size
        f._hashes = raw
        return f

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frontier):
            return NotImplemented
        return self._size == other._size and self._hashes == other._hashes

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"Frontier(size={self._size}, root={self.root().hex()})"


def inclusion_proof(index: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    """PATH(index, D[n]) of RFC 9162 section 2.1.3.1, n = len(leaf_hashes). O(n) hashing.

    The sibling subtrees cover every leaf but one, so this hashes about n nodes; each sibling
    is computed with the iterative root over its slice.
    """
    n = len(leaf_hashes)
    _check_size(index, "leaf index")
    if not index < n:
        raise ProofError(f"leaf index {index} is out of range for tree size {n}")
    _check_leaf_hashes(leaf_hashes, n)
    path: list[bytes] = []
    lo, hi, m = 0, n, index  # the subtree D[lo:hi] holds the leaf, at offset m
    while hi - lo > 1:
        k = _split(hi - lo)
        if m < k:  # PATH(m, D[0:k]) : MTH(D[k:n])
            path.append(_mth(leaf_hashes, lo + k, hi))
            hi = lo + k
        else:  # PATH(m - k, D[k:n]) : MTH(D[0:k])
            path.append(_mth(leaf_hashes, lo, lo + k))
            lo += k
            m -= k
    path.reverse()  # collected root-side first; the RFC lists the leaf side first
    return path


def verify_inclusion(index: int, size: int, leaf_hash: bytes, proof: Sequence[bytes], root: bytes) -> None:
    """Check that ``leaf_hash`` is leaf ``index`` of the tree of ``size`` leaves with ``root``.

    RFC 9162 section 2.1.3.2, step by step. Raises :class:`ProofError` when it does not hold.
    The size is only as trustworthy as its source: take (size, root) from one signed checkpoint.
    """
    _check_size(index, "leaf index")
    _check_size(size, "tree size")
    _check_hash(leaf_hash, "leaf hash")
    _check_hash(root, "root")
    for i, p in enumerate(proof):
        _check_hash(p, f"proof[{i}]")
    # 1. leaf_index must be below tree_size.
    if index >= size:
        raise ProofError(f"leaf index {index} is out of range for tree size {size}")
    # 2. fn = leaf_index, sn = tree_size - 1.  3. r = hash.
    fn, sn = index, size - 1
    r = leaf_hash
    # 4. For each p in the path:
    for p in proof:
        # a. A path longer than the tree is tall fails.
        if sn == 0:
            raise ProofError(f"inclusion proof is too long for tree size {size} ({len(proof)} hashes)")
        # b. p is a left sibling when fn is a right child, or when fn is the last node of its level.
        if fn & 1 or fn == sn:
            r = _sha256(_NODE_PREFIX + p + r).digest()
            if not fn & 1:
                # Skip the levels where the node is an unpaired last node carried up unchanged.
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = _sha256(_NODE_PREFIX + r + p).digest()
        # c.
        fn >>= 1
        sn >>= 1
    # 5. The whole height must have been climbed, to the expected root.
    if sn != 0:
        raise ProofError(f"inclusion proof is too short for tree size {size} ({len(proof)} hashes)")
    if r != root:
        raise ProofError(f"inclusion proof of leaf {index} in tree size {size} does not lead to the root")


def consistency_proof(old_size: int, new_size: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    """PROOF(old_size, D[new_size]) of RFC 9162 section 2.1.4.1 over ``leaf_hashes[:new_size]``.

    The RFC defines proofs for 0 < old_size < new_size; for old_size == 0 or old_size ==
    new_size the proof is empty (there is nothing to prove). Sizes outside
    0 <= old_size <= new_size <= len(leaf_hashes) raise :class:`ProofError`. O(new_size) hashing.
    """
    _check_size(old_size, "old size")
    _check_size(new_size, "new size")
    if old_size > new_size:
        raise ProofError(f"old size {old_size} is larger than new size {new_size}")
    if new_size > len(leaf_hashes):
        raise ProofError(f"new size {new_size} is larger than the {len(leaf_hashes)} leaves given")
    _check_leaf_hashes(leaf_hashes, new_size)
    if old_size == 0 or old_size == new_size:
        return []
    proof: list[bytes] = []
    # SUBPROOF(m, D[lo:hi], complete) while m < hi - lo; `complete` is the RFC's b: the old
    # tree's root is this very subtree, which the verifier already holds.
    lo, hi, m, complete = 0, new_size, old_size, True
    while m != hi - lo:
        k = _split(hi - lo)
        if m <= k:  # SUBPROOF(m, D[0:k], b) : MTH(D[k:n])
            proof.append(_mth(leaf_hashes, lo + k, hi))
            hi = lo + k
        else:  # SUBPROOF(m - k, D[k:n], false) : MTH(D[0:k])
            proof.append(_mth(leaf_hashes, lo, lo + k))
            lo += k
            m -= k
            complete = False
    if not complete:  # SUBPROOF(m, D[m], false) = {MTH(D[m])}
        proof.append(_mth(leaf_hashes, lo, hi))
    proof.reverse()  # the recursion's innermost part comes first
    return proof


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check that the tree (new_size, new_root) extends the tree (old_size, old_root).

    RFC 9162 section 2.1.4.2, step by step, for 0 < old_size < new_size. The cases the RFC
    leaves to the caller: old_size > new_size fails; old_size == 0 needs old_root ==
    :data:`EMPTY_ROOT` (MTH of no leaves) and an empty proof; old_size == new_size needs equal
    roots and an empty proof. Raises :class:`ProofError` when it does not hold. As with
    inclusion, take each (size, root) pair from one signed checkpoint.
    """
    _check_size(old_size, "old size")
    _check_size(new_size, "new size")
    _check_hash(old_root, "old root")
    _check_hash(new_root, "new root")
    for i, p in enumerate(proof):
        _check_hash(p, f"proof[{i}]")
    if old_size > new_size:
        raise ProofError(f"old size {old_size} is larger than new size {new_size}: a log never shrinks")
    if old_size == 0:
        # Stricter than transparency-dev/merkle, which accepts any old root for size 0.
        if old_root != EMPTY_ROOT:
            raise ProofError("the root of an empty tree must be SHA-256 of the empty string")
        if proof:
            raise ProofError(f"consistency proof from size 0 must be empty, got {len(proof)} hashes")
        if new_size == 0 and new_root != EMPTY_ROOT:
            raise ProofError("the root of an empty tree must be SHA-256 of the empty string")
        return
    if old_size == new_size:
        if proof:
            raise ProofError(f"consistency proof between equal sizes must be empty, got {len(proof)} hashes")
        if old_root != new_root:
            raise ProofError(f"different roots for the same tree size {old_size}")
        return
    # 1. An empty path fails.
    if not proof:
        raise ProofError(f"consistency proof from size {old_size} to {new_size} is empty")
    # 2. If first is an exact power of 2, prepend first_hash.
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    # 3. fn = first - 1, sn = second - 1.
    fn, sn = old_size - 1, new_size - 1
    # 4. Climb past the levels where the old tree's last node is a right child.
    while fn & 1:
        fn >>= 1
        sn >>= 1
    # 5. fr = sr = first value of the path.
    fr = sr = path[0]
    # 6. For each subsequent value c:
    for c in path[1:]:
        # a.
        if sn == 0:
            raise ProofError(f"consistency proof from size {old_size} to {new_size} is too long")
        # b.
        if fn & 1 or fn == sn:
            fr = _sha256(_NODE_PREFIX + c + fr).digest()
            sr = _sha256(_NODE_PREFIX + c + sr).digest()
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = _sha256(_NODE_PREFIX + sr + c).digest()
        # c.
        fn >>= 1
        sn >>= 1
    # 7.
    if sn != 0:
        raise ProofError(f"consistency proof from size {old_size} to {new_size} is too short")
    if fr != old_root:
        raise ProofError(f"consistency proof does not lead to the old root (size {old_size})")
    if sr != new_root:
        raise ProofError(f"consistency proof does not lead to the new root (size {new_size})")
