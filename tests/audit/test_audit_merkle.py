"""RFC 6962 / RFC 9162 Merkle tree: published vectors, the RFC's recursive definitions, properties.

Vectors are from transparency-dev/merkle (the Go library behind Trillian and the C2SP tlog
tooling, Apache-2.0): testonly/constants.go (leaves, node hashes, roots, compact ranges) and
proof/verify_test.go (inclusion and consistency proofs, and the corruptions its verifier must
reject). Their proof vectors number leaves from 1; the tables below keep that numbering.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semgov.audit.merkle import (
    EMPTY_ROOT,
    Frontier,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root,
    verify_consistency,
    verify_inclusion,
)


def h(s: str) -> bytes:
    return bytes.fromhex(s)


# testonly/constants.go: LeafInputs, NodeHashes (level, then index), RootHashes (by size),
# CompactTrees (the compact range [0, size) for each size).
LEAF_INPUTS = [
    h(""),
    h("00"),
    h("10"),
    h("2021"),
    h("3031"),
    h("40414243"),
    h("5051525354555657"),
    h("606162636465666768696a6b6c6d6e6f"),
]
NODE_HASHES = [
    [
        h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
        h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
        h("0298d122906dcfc10892cb53a73992fc5b9f493ea4c9badb27b791b4127a7fe7"),
        h("07506a85fd9dd2f120eb694f86011e5bb4662e5c415a62917033d4a9624487e7"),
        h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        h("4271a26be0d8a84f0bd54c8c302e7cb3a3b5d1fa6780a40bcce2873477dab658"),
        h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
        h("46f6ffadd3d06a09ff3c5860d2755c8b9819db7df44251788c7d8e3180de8eb1"),
    ],
    [
        h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
        h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
        h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
    ],
    [
        h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
    ],
    [h("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")],
]
ROOT_HASHES = [
    h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
    h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"),
    h("aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77"),
    h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
    h("4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4"),
    h("76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef"),
    h("ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c"),
    h("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"),
]
NH = NODE_HASHES
COMPACT_TREES = [
    [],
    [NH[0][0]],
    [NH[1][0]],
    [NH[1][0], NH[0][2]],
    [NH[2][0]],
    [NH[2][0], NH[0][4]],
    [NH[2][0], NH[1][2]],
    [NH[2][0], NH[1][2], NH[0][6]],
    [NH[3][0]],
]
LEAVES = [leaf_hash(d) for d in LEAF_INPUTS]

# proof/verify_test.go: inclusionProofs as (leaf counted from 1, tree size, proof).
INCLUSION_VECTORS = [
    (1, 1, []),
    (
        1,
        8,
        [
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        6,
        8,
        [
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (3, 3, [h("fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125")]),
    (
        2,
        5,
        [
            h("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
]
# proof/verify_test.go: consistencyProofs as (size1, size2, proof).
CONSISTENCY_VECTORS = [
    (1, 1, []),
    (
        1,
        8,
        [
            h("96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7"),
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"),
        ],
    ),
    (
        6,
        8,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
    (
        2,
        5,
        [
            h("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
            h("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
        ],
    ),
    (
        6,
        7,
        [
            h("0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a"),
            h("b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f"),
            h("d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"),
        ],
    ),
]
SOME_HASH = h("abacaba000000000000000000000000000000000000000000060061e00123456")


# --- The RFC's recursive definitions, transcribed literally (RFC 9162 sections 2.1.1-2.1.4) ---


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: list[bytes]) -> bytes:
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return d[0]
    k = _k(len(d))
    return hashlib.sha256(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:])).digest()


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = _k(len(d))
    if m < k:
        return ref_path(m, d[:k]) + [ref_mth(d[k:])]
    return ref_path(m - k, d[k:]) + [ref_mth(d[:k])]


def ref_path_shape(m: int, n: int) -> list[str]:
    """Which side each sibling of PATH(m, D[n]) sits on, leaf first."""
    if n == 1:
        return []
    k = _k(n)
    return ref_path_shape(m, k) + ["right"] if m < k else ref_path_shape(m - k, n - k) + ["left"]


def ref_subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    if m == len(d):
        return [] if b else [ref_mth(d)]
    k = _k(len(d))
    if m <= k:
        return ref_subproof(m, d[:k], b) + [ref_mth(d[k:])]
    return ref_subproof(m - k, d[k:], False) + [ref_mth(d[:k])]


def leaves_for(seed: int, n: int) -> list[bytes]:
    return [leaf_hash(seed.to_bytes(8, "big") + i.to_bytes(4, "big")) for i in range(n)]


def flip(b: bytes, bit: int) -> bytes:
    out = bytearray(b)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def fails_inclusion(index: int, size: int, leaf: bytes, proof: list[bytes], rt: bytes) -> bool:
    try:
        verify_inclusion(index, size, leaf, proof, rt)
    except ProofError:
        return True
    return False


def fails_consistency(m: int, n: int, r1: bytes, r2: bytes, proof: list[bytes]) -> bool:
    try:
        verify_consistency(m, n, r1, r2, proof)
    except ProofError:
        return True
    return False


# --- Published vectors ---


def test_hash_prefixes_and_empty_root() -> None:
    """Leaves hash as SHA-256(0x00||d), nodes as SHA-256(0x01||l||r), the empty tree as SHA-256("")."""
    assert leaf_hash(b"") == NODE_HASHES[0][0]
    assert leaf_hash(b"\x00") == NODE_HASHES[0][1]
    assert node_hash(NODE_HASHES[0][0], NODE_HASHES[0][1]) == NODE_HASHES[1][0]
    assert EMPTY_ROOT == ROOT_HASHES[0] == root([])


def test_roots_match_published_vectors() -> None:
    """root() of the first n published leaves equals RootHashes[n] for n = 0..8."""
    for n, want in enumerate(ROOT_HASHES):
        assert root(LEAVES[:n]) == want, n


def test_perfect_subtrees_match_published_node_hashes() -> None:
    """The root of every aligned perfect subtree equals NodeHashes[level][index]."""
    for level, row in enumerate(NODE_HASHES):
        width = 1 << level
        for i, want in enumerate(row):
            assert root(LEAVES[i * width : (i + 1) * width]) == want


def test_frontier_matches_published_compact_ranges_and_roots() -> None:
    """After each append the frontier holds the published compact range and gives the published root."""
    f = Frontier()
    assert list(f.hashes) == COMPACT_TREES[0] and f.root() == ROOT_HASHES[0]
    for n, leaf in enumerate(LEAVES, 1):
        f.append(leaf)
        assert f.size == n
        assert list(f.hashes) == COMPACT_TREES[n]
        assert f.root() == ROOT_HASHES[n]
        assert Frontier.from_leaf_hashes(LEAVES[:n]) == f


@pytest.mark.parametrize(("leaf", "size", "proof"), INCLUSION_VECTORS)
def test_inclusion_proofs_match_published_vectors(leaf: int, size: int, proof: list[bytes]) -> None:
    """inclusion_proof reproduces each published audit path, and the path verifies."""
    assert inclusion_proof(leaf - 1, LEAVES[:size]) == proof
    verify_inclusion(leaf - 1, size, LEAVES[leaf - 1], proof, ROOT_HASHES[size])


@pytest.mark.parametrize(("leaf", "size", "proof"), INCLUSION_VECTORS)
def test_published_inclusion_vectors_reject_corruptions(leaf: int, size: int, proof: list[bytes]) -> None:
    """Every corruption from transparency-dev's corruptInclusionProof fails to verify."""
    i, rt, lh = leaf - 1, ROOT_HASHES[size], LEAVES[leaf - 1]
    probes: list[tuple[int, int, bytes, list[bytes], bytes]] = [
        (i - 1, size, lh, proof, rt),
        (i + 1, size, lh, proof, rt),
        (i ^ 2, size, lh, proof, rt),
        (i, size * 2, lh, proof, rt),
        (i, size // 2, lh, proof, rt),
        (i, size, b"WrongLeaf", proof, rt),
        (i, size, lh, proof, EMPTY_ROOT),
        (i, size, lh, proof, SOME_HASH),
        (i, size, lh, [*proof, b""], rt),
        (i, size, lh, [*proof, rt], rt),
        (i, size, lh, [b"", *proof], rt),
        (i, size, lh, [rt, *proof], rt),
    ]
    for j in range(len(proof)):
        bad = list(proof)
        bad[j] = bytes([bad[j][0] ^ 8]) + bad[j][1:]
        probes.append((i, size, lh, bad, rt))
    if proof:
        probes.append((i, size, lh, proof[:-1], rt))
    if len(proof) > 1:
        probes.append((i, size, lh, [proof[0], SOME_HASH, *proof[1:]], rt))
    for p in probes:
        assert fails_inclusion(*p), p


@pytest.mark.parametrize(("size1", "size2", "proof"), CONSISTENCY_VECTORS)
def test_consistency_proofs_match_published_vectors(size1: int, size2: int, proof: list[bytes]) -> None:
    """consistency_proof reproduces each published proof, and the proof verifies."""
    assert consistency_proof(size1, size2, LEAVES) == proof
    verify_consistency(size1, size2, ROOT_HASHES[size1], ROOT_HASHES[size2], proof)


@pytest.mark.parametrize(("size1", "size2", "proof"), [v for v in CONSISTENCY_VECTORS if v[2]])
def test_published_consistency_vectors_reject_corruptions(size1: int, size2: int, proof: list[bytes]) -> None:
    """Every corruption from transparency-dev's corruptConsistencyProof fails to verify."""
    r1, r2 = ROOT_HASHES[size1], ROOT_HASHES[size2]
    probes: list[tuple[int, int, bytes, bytes, list[bytes]]] = [
        (size1 - 1, size2, r1, r2, proof),
        (size1 + 1, size2, r1, r2, proof),
        (size1 ^ 2, size2, r1, r2, proof),
        (size1, size2 * 2, r1, r2, proof),
        (size1, size2 // 2, r1, r2, proof),
        (size1, size2, b"WrongRoot", r2, proof),
        (size1, size2, r1, b"WrongRoot", proof),
        (size1, size2, r2, r1, proof),
        (size1, size2, r1, r2, []),
        (size1, size2, r1, r2, [*proof, b""]),
        (size1, size2, r1, r2, [*proof, r1]),
        (size1, size2, r1, r2, [*proof, r2]),
        (size1, size2, r1, r2, [b"", *proof]),
        (size1, size2, r1, r2, [r1, *proof]),
        (size1, size2, r1, r2, [r2, *proof]),
        (size1, size2, r1, r2, [proof[0], *proof]),
        (size1, size2, r1, r2, proof[:-1]),
    ]
    for j in range(len(proof)):
        bad = list(proof)
        bad[j] = bytes([bad[j][0] ^ 16]) + bad[j][1:]
        probes.append((size1, size2, r1, r2, bad))
    for p in probes:
        assert fails_consistency(*p), p


def test_consistency_edge_cases() -> None:
    """Equal sizes need equal roots and no proof; size 0 needs the empty root, no proof; shrinking fails."""
    r1, r2 = ROOT_HASHES[1], ROOT_HASHES[2]
    verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    verify_consistency(0, 1, EMPTY_ROOT, r1, [])
    verify_consistency(0, 5, EMPTY_ROOT, ROOT_HASHES[5], [])
    verify_consistency(1, 1, r1, r1, [])
    verify_consistency(2, 2, r2, r2, [])
    bad = [
        (0, 0, EMPTY_ROOT, r1, []),  # size 0 has one root
        (0, 1, r1, r2, []),  # the old root of size 0 must be the empty root (transparency-dev accepts any)
        (0, 0, EMPTY_ROOT, EMPTY_ROOT, [EMPTY_ROOT]),  # proof must be empty
        (0, 1, EMPTY_ROOT, r1, [EMPTY_ROOT]),
        (1, 1, r1, r2, []),  # same size, different roots
        (1, 1, r1, r1, [EMPTY_ROOT]),
        (1, 0, r1, EMPTY_ROOT, []),  # time travel
        (2, 1, r2, r1, []),
        (8, 6, ROOT_HASHES[8], ROOT_HASHES[6], consistency_proof(6, 8, LEAVES)),
        (1, 2, r1, r2, []),  # a real extension needs a proof
        (-1, 2, r1, r2, []),
        (1, 2**64, r1, r2, []),
    ]
    for p in bad:
        assert fails_consistency(*p), p


def test_proof_requests_out_of_range_raise() -> None:
    """Asking for a proof with an index or sizes outside the leaves given raises ProofError."""
    for index, leaves in [(0, []), (3, LEAVES[:3]), (-1, LEAVES)]:
        with pytest.raises(ProofError, match="out of range"):
            inclusion_proof(index, leaves)
    with pytest.raises(ProofError, match="larger than new size"):
        consistency_proof(5, 4, LEAVES)
    with pytest.raises(ProofError, match="larger than the 8 leaves"):
        consistency_proof(4, 9, LEAVES)
    with pytest.raises(ProofError, match="out of range"):
        consistency_proof(-1, 4, LEAVES)
    assert consistency_proof(0, 8, LEAVES) == [] and consistency_proof(8, 8, LEAVES) == []


def test_malformed_hashes_are_rejected() -> None:
    """Leaf hashes, roots and proof elements that are not 32 bytes are refused, not hashed."""
    with pytest.raises(ProofError, match="leaf hash 1 must be 32 bytes, got 31 bytes"):
        root([LEAVES[0], LEAVES[1][:31]])
    with pytest.raises(ProofError, match="leaf hash 2 must be 32 bytes"):
        inclusion_proof(0, [*LEAVES[:2], "x" * 32])  # type: ignore[list-item]
    with pytest.raises(ProofError, match="leaf hash must be 32 bytes"):
        Frontier().append(b"short")
    with pytest.raises(ProofError, match=r"proof\[0\] must be 32 bytes"):
        verify_inclusion(0, 2, LEAVES[0], [LEAVES[1] + b"\x00"], ROOT_HASHES[2])


# --- Against the RFC's recursive definitions and an independent implementation ---


def test_matches_rfc_recursive_definitions_exhaustively() -> None:
    """Up to size 48, the root, every audit path and every consistency proof equal the RFC's recursion."""
    leaves = leaves_for(7, 48)
    for n in range(1, 49):
        d = leaves[:n]
        rt = ref_mth(d)
        assert root(d) == rt
        for m in range(n):
            path = inclusion_proof(m, d)
            assert path == ref_path(m, d)
            verify_inclusion(m, n, d[m], path, rt)
        for m in range(n + 1):
            proof = consistency_proof(m, n, leaves)
            assert proof == (ref_subproof(m, d, True) if 0 < m < n else [])
            verify_consistency(m, n, ref_mth(leaves[:m]), rt, proof)


def test_cross_check_with_pymerkle() -> None:
    """pymerkle (RFC 6962 hashing) agrees on every root up to size 300 and on audit paths up to size 40."""
    pymerkle = pytest.importorskip("pymerkle")
    data = [b"entry-%d" % i for i in range(300)]
    tree = pymerkle.InmemoryTree(algorithm="sha256")
    for d in data:
        tree.append_entry(d)
    ours = [leaf_hash(d) for d in data]
    for n in range(0, 301):
        assert tree.get_root(n) == root(ours[:n]), n
    for n in range(1, 41):
        for i in range(n):
            theirs = tree.prove_inclusion(i + 1, n)  # pymerkle counts leaves from 1
            # pymerkle's path starts with the leaf itself, then the RFC's siblings.
            assert theirs.path[1:] == inclusion_proof(i, ours[:n]), (i, n)


# --- Frontier ---


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(0, 300))
def test_frontier_root_equals_root_at_every_size(seed: int, n: int) -> None:
    """Appending leaves one by one, the frontier's root equals root() of the prefix at every size."""
    leaves = leaves_for(seed, n)
    f = Frontier()
    assert f.root() == root([])
    for i, leaf in enumerate(leaves, 1):
        f.append(leaf)
        assert f.size == i
        assert len(f.hashes) == bin(i).count("1")
        assert f.root() == root(leaves[:i])
    assert Frontier.from_leaf_hashes(leaves) == f


def test_frontier_json_round_trip_and_copy() -> None:
    """to_json/from_json round-trip the state, and copy() is independent of the original."""
    f = Frontier.from_leaf_hashes(leaves_for(1, 13))
    d = f.to_json()
    assert d["size"] == 13 and len(d["hashes"]) == 3
    assert all(isinstance(x, str) and len(x) == 64 for x in d["hashes"])
    g = Frontier.from_json(d)
    assert g == f and g.root() == f.root()
    c = f.copy()
    c.append(leaf_hash(b"more"))
    assert f.size == 13 and c.size == 14 and f.root() == g.root() != c.root()
    assert Frontier.from_json({"size": 0, "hashes": []}).root() == EMPTY_ROOT


@pytest.mark.parametrize(
    ("d", "message"),
    [
        ([], "expected an object"),
        ({"size": 1}, "expected keys"),
        ({"size": 1, "hashes": ["00" * 32], "x": 1}, "expected keys"),
        ({"size": True, "hashes": ["00" * 32]}, "size must be an integer"),
        ({"size": -1, "hashes": []}, "size must be an integer"),
        ({"size": 2**64, "hashes": ["00" * 32]}, "size must be an integer"),
        ({"size": "1", "hashes": ["00" * 32]}, "size must be an integer"),
        ({"size": 1, "hashes": "00" * 32}, "hashes must be a list"),
        ({"size": 3, "hashes": ["00" * 32]}, "needs 2 hashes"),
        ({"size": 1, "hashes": []}, "needs 1 hashes"),
        ({"size": 1, "hashes": ["AB" * 32]}, "lowercase hex"),
        ({"size": 1, "hashes": ["00" * 31]}, "lowercase hex"),
        ({"size": 1, "hashes": [" " + "00" * 31 + "0"]}, "lowercase hex"),
        ({"size": 1, "hashes": [0]}, "lowercase hex"),
    ],
)
def test_frontier_from_json_rejects_malformed_state(d: object, message: str) -> None:
    """from_json refuses a malformed state with a ValueError saying what is wrong."""
    with pytest.raises(ValueError, match=message):
        Frontier.from_json(d)


# --- Properties of proofs ---


@settings(max_examples=150, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32), total=st.integers(1, 300))
def test_inclusion_proofs_verify_and_tampering_fails(data: st.DataObject, seed: int, total: int) -> None:
    """Inclusion proofs verify; bit flips, wrong index fail; a wrong size passes only for an equal path."""
    leaves = leaves_for(seed, total)
    n = data.draw(st.integers(1, total), label="size")
    i = data.draw(st.integers(0, n - 1), label="index")
    rt = root(leaves[:n])
    proof = inclusion_proof(i, leaves[:n])
    assert len(proof) == len(ref_path_shape(i, n))
    verify_inclusion(i, n, leaves[i], proof, rt)
    if proof:
        j = data.draw(st.integers(0, len(proof) - 1), label="element")
        bit = data.draw(st.integers(0, 255), label="bit")
        bad = list(proof)
        bad[j] = flip(bad[j], bit)
        assert fails_inclusion(i, n, leaves[i], bad, rt)
    bit = data.draw(st.integers(0, 255), label="leaf or root bit")
    assert fails_inclusion(i, n, flip(leaves[i], bit), proof, rt)
    assert fails_inclusion(i, n, leaves[i], proof, flip(rt, bit))
    if n > 1:
        other = data.draw(st.integers(0, n - 1).filter(lambda x: x != i), label="wrong index")
        assert fails_inclusion(other, n, leaves[i], proof, rt)
    n2 = data.draw(st.integers(1, total).filter(lambda x: x != n), label="wrong size") if total > 1 else n
    if n2 != n:
        # A wrong size with that size's true root passes only if the path is that size's honest
        # path; with the original root it passes exactly when both sizes give the path the same
        # shape (see test_sizes_are_bound_only_through_the_roots).
        honest = inclusion_proof(i, leaves[:n2]) if i < n2 else None
        assert fails_inclusion(i, n2, leaves[i], proof, root(leaves[:n2])) == (honest != proof)
        same_shape = i < n2 and ref_path_shape(i, n2) == ref_path_shape(i, n)
        assert fails_inclusion(i, n2, leaves[i], proof, rt) == (not same_shape)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32), total=st.integers(1, 300))
def test_consistency_proofs_verify_and_tampering_fails(data: st.DataObject, seed: int, total: int) -> None:
    """Consistency proofs verify; bit flips, swapped sizes fail; other sizes pass only for an equal proof."""
    leaves = leaves_for(seed, total)
    n = data.draw(st.integers(0, total), label="new size")
    m = data.draw(st.integers(0, n), label="old size")
    r1, r2 = root(leaves[:m]), root(leaves[:n])
    proof = consistency_proof(m, n, leaves)
    verify_consistency(m, n, r1, r2, proof)
    if proof:
        j = data.draw(st.integers(0, len(proof) - 1), label="element")
        bit = data.draw(st.integers(0, 255), label="bit")
        bad = list(proof)
        bad[j] = flip(bad[j], bit)
        assert fails_consistency(m, n, r1, r2, bad)
        assert fails_consistency(m, n, r1, r2, proof[:-1])
        assert fails_consistency(m, n, r1, r2, [*proof, proof[-1]])
    bit = data.draw(st.integers(0, 255), label="root bit")
    assert fails_consistency(m, n, flip(r1, bit), r2, proof)
    if not m == 0 < n:  # every tree extends the empty one, whatever its root
        assert fails_consistency(m, n, r1, flip(r2, bit), proof)
    if m < n:
        assert fails_consistency(n, m, r2, r1, proof)
    m2 = data.draw(st.integers(0, total), label="other old size")
    n2 = data.draw(st.integers(m2, total), label="other new size")
    if (m2, n2) != (m, n):
        honest = consistency_proof(m2, n2, leaves)
        assert fails_consistency(m2, n2, root(leaves[:m2]), root(leaves[:n2]), proof) == (honest != proof)


def test_sizes_are_bound_only_through_the_roots() -> None:
    """A proof alone does not pin the tree size: take (size, root) together from one signed checkpoint."""
    d = LEAVES
    # Leaf 0 in the tree of size 3 has the path shape of leaf 0 in size 4 (two right siblings).
    verify_inclusion(0, 4, d[0], inclusion_proof(0, d[:3]), ROOT_HASHES[3])
    # The size-3 root "extends" size 2 as if it were a size-4 root.
    verify_consistency(2, 4, ROOT_HASHES[2], ROOT_HASHES[3], consistency_proof(2, 3, d))
    # With the true roots of the claimed sizes both fail.
    assert fails_inclusion(0, 4, d[0], inclusion_proof(0, d[:3]), ROOT_HASHES[4])
    assert fails_consistency(2, 4, ROOT_HASHES[2], ROOT_HASHES[4], consistency_proof(2, 3, d))
