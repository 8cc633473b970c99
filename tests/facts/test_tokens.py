"""Token verification: exact spans, segment boundaries, completeness on planted runs."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from semgov.facts.tokens import SegmentTable, anchor_k, as_tokens, find_spans, kgram_index, token_hash


def seg(*parts: tuple[str, int]) -> SegmentTable:
    out, pos = [], 0
    for role, n in parts:
        out.append((role, pos, pos + n))
        pos += n
    return SegmentTable.from_triples(out)


def arr(*chunks: range | list[int]) -> np.ndarray:
    return np.array([t for c in chunks for t in c], dtype=np.uint32)


def test_token_hash_is_sha256_of_le_uint32() -> None:
    """The provenance token hash is SHA-256 of little-endian uint32 ids."""
    import hashlib
    import struct

    ids = [0, 1, 49151, 2**32 - 1]
    assert token_hash(np.array(ids, dtype=np.uint32)) == hashlib.sha256(struct.pack("<4I", *ids)).hexdigest()


def test_identical_prompts_are_all_prefix_split_by_segment() -> None:
    """An exact repeat is the whole prompt as prefix spans, one per segment."""
    t = arr(range(100))
    s = seg(("system", 10), ("evidence", 80), ("question", 10))
    lcp, spans = find_spans(t, s, t, s, min_span=32)
    assert lcp == 100
    assert [(x.recipient_start, x.length, x.kind, x.recipient_role) for x in spans] == [
        (0, 10, "prefix", "system"),
        (10, 80, "prefix", "evidence"),
        (90, 10, "prefix", "question"),
    ]


def test_prefix_split_at_donor_boundaries_too() -> None:
    """Spans never cross a segment boundary of the donor either."""
    t = arr(range(100))
    lcp, spans = find_spans(t, seg(("evidence", 100)), t, seg(("evidence", 40), ("question", 60)), min_span=8)
    assert [(x.length, x.donor_role) for x in spans] == [(40, "evidence"), (60, "question")]


def test_shifted_run_found_with_offset() -> None:
    """Evidence moved behind a longer wrapper is found as one shifted span."""
    d = arr(range(0, 30), range(1000, 1500), range(50, 60))
    r = arr(range(200, 250), range(1000, 1500), range(70, 80))
    lcp, spans = find_spans(
        r,
        seg(("system", 50), ("evidence", 500), ("question", 10)),
        d,
        seg(("system", 30), ("evidence", 500), ("question", 10)),
        min_span=32,
    )
    assert lcp == 0
    assert [(x.recipient_start, x.donor_start, x.length, x.kind) for x in spans] == [(50, 30, 500, "shifted")]


def test_runs_shorter_than_min_span_are_dropped() -> None:
    """A shifted run below min_span is not reported; the same run at min_span is."""
    d = arr(range(0, 5), range(1000, 1031), range(9000, 9010))
    r = arr(range(500, 510), range(1000, 1031), range(7000, 7010))
    s_r, s_d = seg(("evidence", 51)), seg(("evidence", 46))
    assert find_spans(r, s_r, d, s_d, min_span=32)[1] == []
    assert [x.length for x in find_spans(r, s_r, d, s_d, min_span=31)[1]] == [31]


def test_no_overlap_between_prefix_and_shifted() -> None:
    """Positions covered by the prefix are not reported again as shifted."""
    block = list(range(1000, 1100))
    d = arr(block, block)
    r = arr(block, range(5000, 5010), block)
    lcp, spans = find_spans(r, seg(("evidence", 210)), d, seg(("evidence", 200)), min_span=32)
    covered = np.zeros(len(r), dtype=int)
    for x in spans:
        covered[x.recipient_start : x.recipient_start + x.length] += 1
    assert covered.max() == 1
    assert lcp == 100 and sum(x.length for x in spans) == 200


def test_repetitive_input_stays_exact_and_bounded() -> None:
    """A prompt of one repeated token yields exact, non-overlapping spans."""
    r = np.full(5000, 7, dtype=np.uint32)
    d = np.full(4000, 7, dtype=np.uint32)
    lcp, spans = find_spans(r, seg(("evidence", 5000)), d, seg(("evidence", 4000)), min_span=32)
    assert lcp == 4000
    for x in spans:
        assert (
            r[x.recipient_start : x.recipient_start + x.length] == d[x.donor_start : x.donor_start + x.length]
        ).all()


@st.composite
def planted(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Random prompts of distinct tokens with one identical run planted at arbitrary offsets."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    length = draw(st.integers(32, 400))
    rpre, dpre = draw(st.integers(1, 300)), draw(st.integers(0, 300))
    rpost, dpost = draw(st.integers(0, 200)), draw(st.integers(0, 200))
    pool = rng.permutation(200_000).astype(np.uint32)
    run = pool[:length]
    r = np.concatenate([pool[length : length + rpre], run, pool[100_000 : 100_000 + rpost]])
    d = np.concatenate([pool[50_000 : 50_000 + dpre], run, pool[150_000 : 150_000 + dpost]])
    return r, d, rpre, dpre, length


@settings(max_examples=300, deadline=None)
@given(planted())
def test_planted_run_is_found_exactly(case: tuple[np.ndarray, np.ndarray, int, int, int]) -> None:
    """Any identical run of at least min_span tokens is found, at the right offset, exactly."""
    r, d, rpre, dpre, length = case
    lcp, spans = find_spans(r, seg(("evidence", len(r))), d, seg(("evidence", len(d))), min_span=32)
    assert lcp == 0
    assert [(x.recipient_start, x.donor_start, x.length) for x in spans] == [(rpre, dpre, length)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=300),
    st.lists(st.integers(0, 6), min_size=1, max_size=300),
    st.integers(1, 40),
    st.integers(0, 300),
    st.integers(0, 300),
)
def test_spans_are_exact_disjoint_and_within_segments(
    rt: list[int], dt: list[int], min_span: int, rcut: int, dcut: int
) -> None:
    """On arbitrary low-entropy input, every span is token-identical, disjoint and segment-local."""
    r, d = np.array(rt, dtype=np.uint32), np.array(dt, dtype=np.uint32)
    rc, dc = min(max(rcut, 1), len(r)), min(max(dcut, 1), len(d))
    rs = seg(("system", rc), ("evidence", len(r) - rc)) if rc < len(r) else seg(("system", len(r)))
    ds = seg(("evidence", dc), ("question", len(d) - dc)) if dc < len(d) else seg(("evidence", len(d)))
    lcp, spans = find_spans(r, rs, d, ds, min_span=min_span)
    covered = np.zeros(len(r), dtype=int)
    for x in spans:
        a, b = x.recipient_start, x.recipient_start + x.length
        assert (r[a:b] == d[x.donor_start : x.donor_start + x.length]).all()
        covered[a:b] += 1
        assert rs.index_at(a) == rs.index_at(b - 1)
        assert ds.index_at(x.donor_start) == ds.index_at(x.donor_start + x.length - 1)
        if x.kind == "prefix":
            assert x.recipient_start == x.donor_start and b <= lcp
        else:
            assert x.length >= min_span and a >= lcp
    assert covered.max(initial=0) <= 1
    assert (r[:lcp] == d[:lcp]).all() and (lcp == min(len(r), len(d)) or r[lcp] != d[lcp])


@settings(max_examples=200, deadline=None)
@given(
    r=st.lists(st.integers(0, 6), min_size=0, max_size=300),
    d=st.lists(st.integers(0, 6), min_size=0, max_size=300),
    min_span=st.sampled_from([2, 4, 8, 32]),
)
def test_a_registered_donor_index_gives_exactly_the_spans_of_a_fresh_search(
    r: list[int], d: list[int], min_span: int
) -> None:
    """find_spans with the donor's prebuilt k-gram index returns what it returns building it itself."""
    rt, dt = as_tokens(r), as_tokens(d)
    rseg, dseg = (
        SegmentTable.from_triples([("other", 0, len(r))]),
        SegmentTable.from_triples([("other", 0, len(d))]),
    )
    index = kgram_index(dt, anchor_k(min_span))
    assert find_spans(rt, rseg, dt, dseg, min_span=min_span, donor_index=index) == find_spans(
        rt, rseg, dt, dseg, min_span=min_span
    )
    wrong_k = kgram_index(dt, 1)  # an index for another k is not used (no min_span here anchors on 1)
    assert find_spans(rt, rseg, dt, dseg, min_span=min_span, donor_index=wrong_k) == find_spans(
        rt, rseg, dt, dseg, min_span=min_span
    )


def test_repeated_blocks_behind_a_new_wrapper_are_all_found() -> None:
    """Each anchor meets the donor copies nearest it: 400 repeated blocks behind a new wrapper all match."""
    rng = np.random.default_rng(3)
    block = rng.integers(0, 40_000, 40).astype(np.uint32)

    def body(sep: int) -> np.ndarray:  # NOTE: separators differ between the prompts: one run per block
        return np.concatenate([np.append(block, np.uint32(sep + i)) for i in range(400)])

    d = np.concatenate([rng.integers(0, 40_000, 30).astype(np.uint32), body(50_000)])
    r = np.concatenate([rng.integers(40_000, 45_000, 47).astype(np.uint32), body(60_000)])
    one = SegmentTable.from_triples
    lcp, spans = find_spans(r, one([("other", 0, len(r))]), d, one([("other", 0, len(d))]), min_span=32)
    assert lcp == 0 and len(spans) == 400 and sum(s.length for s in spans) == 400 * 40


@settings(max_examples=300, deadline=None)
@given(flags=st.lists(st.booleans(), max_size=200), min_len=st.integers(1, 6))
def test_runs_are_exactly_the_maximal_true_stretches(flags: list[bool], min_len: int) -> None:
    """_runs returns every maximal run of True of at least min_len, in order, as starts and lengths."""
    from semgov.facts.tokens import _runs

    want: list[tuple[int, int]] = []
    i = 0
    while i < len(flags):
        if flags[i]:
            j = i
            while j < len(flags) and flags[j]:
                j += 1
            if j - i >= min_len:
                want.append((i, j - i))
            i = j
        else:
            i += 1
    starts, lengths = _runs(np.array(flags, dtype=np.bool_), min_len)
    assert starts.dtype == lengths.dtype == np.int64
    assert list(zip(starts.tolist(), lengths.tolist(), strict=True)) == want
