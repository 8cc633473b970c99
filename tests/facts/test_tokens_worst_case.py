"""Token verification in the worst case (issue 12, item 4): same spans as before, bounded work.

The span search used to resolve overlaps by comparing every run with every span already
taken: quadratic on repeated 32-token blocks with differing separators (33,000 tokens: 15.5
million interval comparisons, 6 s). :func:`reference_find_spans` is that algorithm, kept here
as the slow reference: the new one must return exactly its spans, on random and adversarial
layouts, while its work counters stay linear. No test here measures time.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.token_adversarial import LAYOUTS, Layout, blocks, normal_pair, one_segment, per_token
from semgov._internal.deadline import Deadline, DeadlineExceeded
from semgov.facts.tokens import (
    MAX_DIAGONALS,
    U32,
    FoundSpan,
    SegmentTable,
    SpanWork,
    _candidate_diagonals,
    _runs,
    anchor_k,
    find_spans,
    kgram_index,
)

ROLES = ("system", "instruction", "evidence", "question", "other")
Case = tuple[U32, SegmentTable, U32, SegmentTable, int]


def _reference_split(
    rs: int, ds: int, length: int, kind: Literal["prefix", "shifted"], rseg: SegmentTable, dseg: SegmentTable
) -> list[FoundSpan]:
    """The old ``_split``: cut points from boolean masks over every segment end."""
    cuts = {rs, rs + length}
    re_ = rseg.ends
    cuts.update(int(x) for x in re_[(re_ > rs) & (re_ < rs + length)])
    de = dseg.ends
    cuts.update(int(x) - ds + rs for x in de[(de > ds) & (de < ds + length)])
    pts = sorted(cuts)
    return [
        FoundSpan(
            a, a - rs + ds, b - a, kind, rseg.roles[rseg.index_at(a)], dseg.roles[dseg.index_at(a - rs + ds)]
        )
        for a, b in zip(pts, pts[1:], strict=False)
    ]


def reference_find_spans(
    r: U32, rseg: SegmentTable, d: U32, dseg: SegmentTable, *, min_span: int, counter: list[int] | None = None
) -> tuple[int, list[FoundSpan]]:
    """The old ``find_spans`` (before issue 12), verbatim but for ``counter`` (interval comparisons)."""
    m = min(len(r), len(d))
    ne = r[:m] != d[:m]
    lcp = int(ne.argmax()) if m and ne.any() else m
    spans: list[FoundSpan] = _reference_split(0, 0, lcp, "prefix", rseg, dseg) if lcp else []
    runs: list[tuple[int, int, int]] = []
    for off in _candidate_diagonals(r, d, lcp, min_span):
        lo = max(lcp, -off)
        hi = min(len(r), len(d) - off)
        if hi - lo < min_span:
            continue
        starts, lengths = _runs(r[lo:hi] == d[lo + off : hi + off], min_span)
        runs.extend((int(n), int(s) + lo, off) for s, n in zip(starts, lengths, strict=True))
    runs.sort(key=lambda x: (-x[0], x[1], x[2]))
    taken: list[tuple[int, int]] = [(0, lcp)] if lcp else []
    for length, rs, off in runs:
        pieces = [(rs, rs + length)]
        for a, b in taken:
            if counter is not None:
                counter[0] += 1
            nxt = []
            for s, e in pieces:
                if e <= a or s >= b:
                    nxt.append((s, e))
                    continue
                if s < a:
                    nxt.append((s, a))
                if e > b:
                    nxt.append((b, e))
            pieces = nxt
        for s, e in pieces:
            if e - s < min_span:
                continue
            taken.append((s, e))
            spans.extend(
                p for p in _reference_split(s, s + off, e - s, "shifted", rseg, dseg) if p.length >= min_span
            )
    spans.sort(key=lambda s: s.recipient_start)
    return lcp, spans


def tiling(n: int, cuts: list[int], roles: list[str]) -> SegmentTable:
    """Segments tiling ``n`` tokens, cut at ``cuts`` (deduplicated, inside 1..n-1)."""
    pts = [0, *sorted({c for c in cuts if 0 < c < n}), n]
    return SegmentTable.from_triples(
        [(roles[i % len(roles)], a, b) for i, (a, b) in enumerate(zip(pts, pts[1:], strict=False))]  # type: ignore[misc]
    )


def same_as_reference(r: U32, rseg: SegmentTable, d: U32, dseg: SegmentTable, min_span: int) -> SpanWork:
    """Assert the new search returns the reference's output exactly, and bounded counts; return its work."""
    work = SpanWork()
    got = find_spans(r, rseg, d, dseg, min_span=min_span, work=work)
    assert got == reference_find_spans(r, rseg, d, dseg, min_span=min_span)
    assert_bounded(got, work, len(r), len(rseg.roles), len(dseg.roles), min_span)
    return work


def assert_bounded(
    found: tuple[int, list[FoundSpan]], work: SpanWork, n: int, s_r: int, s_d: int, min_span: int
) -> None:
    """The worst-case bounds find_spans documents: runs, greedy steps and bytes read, spans returned."""
    lcp, spans = found
    assert work.runs <= MAX_DIAGONALS * (n // (min_span + 1) + 1)
    assert work.considered <= min(work.runs, max(n - lcp, 0))  # at most one run per start position
    assert work.scanned <= MAX_DIAGONALS * n
    assert work.pieces <= max(n - lcp, 0) // min_span
    assert work.steps <= 7 * work.considered + 2 * work.scanned // min_span
    assert work.cuts <= n  # cut pieces are disjoint and non-empty in the recipient
    prefix = sum(1 for x in spans if x.kind == "prefix")
    assert prefix <= min(lcp, s_r + s_d)
    assert len(spans) - prefix <= max(n - lcp, 0) // min_span


@st.composite
def low_entropy(draw: st.DrawFn) -> Case:
    """Two prompts over a tiny vocabulary (so they share runs everywhere), random segments and min_span."""
    vocab = draw(st.integers(1, 6))
    rt = draw(st.lists(st.integers(0, vocab), min_size=1, max_size=400))
    dt = draw(st.lists(st.integers(0, vocab), min_size=1, max_size=400))
    how = draw(st.sampled_from(["independent", "prefix", "mutated"]))
    if how == "prefix":
        dt = rt[: draw(st.integers(0, len(rt)))] + dt
    elif how == "mutated":  # a shifted copy with edits: shifted runs, trimmed by each other
        dt = dt[: draw(st.integers(0, 30))] + rt
        for pos in draw(st.lists(st.integers(0, len(dt) - 1), max_size=20)):
            dt[pos] = vocab + 1
    r, d = np.array(rt, dtype=np.uint32), np.array(dt, dtype=np.uint32)
    rseg = tiling(len(r), draw(st.lists(st.integers(1, 400), max_size=12)), list(ROLES))
    dseg = tiling(len(d), draw(st.lists(st.integers(1, 400), max_size=12)), list(ROLES[::-1]))
    return r, rseg, d, dseg, draw(st.one_of(st.integers(1, 6), st.integers(1, 40)))


@st.composite
def repeated_blocks(draw: st.DrawFn) -> Case:
    """A block repeated with separators of random widths, maybe shared ones, maybe one-token segments."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    b = draw(st.integers(1, 48))
    block = rng.integers(0, 50, b).astype(np.uint32)

    def side(base: int) -> np.ndarray:
        copies = draw(st.integers(1, 40))
        out = [np.arange(draw(st.integers(0, 3)), dtype=np.uint32) + base + 9_000]  # lead-in: maybe no prefix
        for i in range(copies):
            out.append(block)
            width = draw(st.integers(0, 3))
            shared = draw(st.booleans())
            out.append(np.arange(width, dtype=np.uint32) + (7_000 if shared else base + 10 * i))
        return np.concatenate(out)

    r, d = side(100_000), side(200_000)
    fine = draw(st.sampled_from(["one", "per_token", "random"]))
    if fine == "per_token":
        rseg, dseg = (
            tiling(len(r), list(range(len(r))), list(ROLES)),
            tiling(len(d), list(range(len(d))), ["evidence"]),
        )
    elif fine == "random":
        rseg = tiling(len(r), draw(st.lists(st.integers(1, len(r)), max_size=30)), list(ROLES))
        dseg = tiling(len(d), draw(st.lists(st.integers(1, len(d)), max_size=30)), list(ROLES))
    else:
        rseg, dseg = tiling(len(r), [], ["evidence"]), tiling(len(d), [], ["evidence"])
    return r, rseg, d, dseg, draw(st.integers(1, max(1, b)))


@settings(max_examples=400, deadline=None)
@given(low_entropy())
def test_same_spans_as_reference_on_low_entropy_input(case: Case) -> None:
    """On random low-entropy prompts, segments and min_span, the spans equal the old algorithm's."""
    same_as_reference(*case)


@settings(max_examples=300, deadline=None)
@given(repeated_blocks())
def test_same_spans_as_reference_on_repeated_blocks(case: Case) -> None:
    """On repeated blocks with differing or shared separators and fine segments, spans are the old ones."""
    same_as_reference(*case)


@st.composite
def planted_runs(draw: st.DrawFn) -> Case:
    """High-entropy prompts (k-grams unique: the windowed comparison) sharing planted runs around
    min_span, some cut by single edits, maybe a common prefix, random segments."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    r = rng.integers(0, 50_000, draw(st.integers(1, 1200))).astype(np.uint32)
    d = rng.integers(0, 50_000, draw(st.integers(1, 1200))).astype(np.uint32)
    min_span = draw(st.integers(1, 48))
    for _ in range(draw(st.integers(0, 8))):
        n = draw(st.integers(1, 3 * min_span + 2))
        if n < min(len(r), len(d)):
            a, b = draw(st.integers(0, len(r) - n)), draw(st.integers(0, len(d) - n))
            d[b : b + n] = r[a : a + n]
    if draw(st.booleans()):
        p = draw(st.integers(0, min(len(r), len(d))))
        d[:p] = r[:p]
    for pos in draw(st.lists(st.integers(0, len(r) - 1), max_size=3)):
        r[pos] = 50_001
    rseg = tiling(len(r), draw(st.lists(st.integers(1, len(r)), max_size=5)), list(ROLES))
    dseg = tiling(len(d), draw(st.lists(st.integers(1, len(d)), max_size=5)), list(ROLES[::-1]))
    return r, rseg, d, dseg, min_span


@settings(max_examples=1500, deadline=None)
@given(planted_runs())
def test_same_spans_as_reference_on_planted_runs(case: Case) -> None:
    """Where each anchor meets one donor position, comparing only each diagonal's window around its hit
    anchors gives exactly the spans of comparing the whole diagonal (the reference)."""
    r, rseg, d, dseg, min_span = case
    same_as_reference(*case)
    index = kgram_index(d, anchor_k(min_span))
    assert find_spans(r, rseg, d, dseg, min_span=min_span, donor_index=index) == find_spans(
        r, rseg, d, dseg, min_span=min_span
    )


def test_a_diagonal_hit_only_near_the_end_is_compared_only_there() -> None:
    """Unrelated evidence behind a shared 30-token question: the question's diagonal is compared over
    a window of about two strides, not over the whole prompt (and no span of 32 or more is found)."""
    rng = np.random.default_rng(7)
    q = rng.integers(0, 50_000, 30).astype(np.uint32)
    r = np.concatenate([rng.integers(0, 50_000, 18_000).astype(np.uint32), q])
    d = np.concatenate([rng.integers(0, 50_000, 18_000).astype(np.uint32), q])
    tab = SegmentTable.from_triples([("evidence", 0, 18_030)])  # type: ignore[list-item]
    work = SpanWork()
    assert find_spans(r, tab, d, tab, min_span=32, work=work) == (0, [])
    assert 0 < work.compared <= 30 + 2 * 32
    wide = SpanWork()
    find_spans(r, tab, d, tab, min_span=32, work=wide, donor_index=kgram_index(d, 8))
    assert wide.compared == work.compared


def test_repeated_kgrams_compare_the_whole_diagonal() -> None:
    """When some anchor's k-gram occurs twice in the donor, its diagonals are compared whole."""
    lay = LAYOUTS["blocks_seps"](2500)
    rseg, dseg = lay.tables()
    work = SpanWork()
    find_spans(lay.r, rseg, lay.d, dseg, min_span=32, work=work)
    assert work.compared >= len(lay.r) - 64


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("n", [700, 2500])
def test_same_spans_as_reference_on_benchmark_layouts(name: str, n: int) -> None:
    """Every adversarial layout of the benchmark, small enough for the reference, gives the old spans."""
    lay = LAYOUTS[name](n)
    rseg, dseg = lay.tables()
    same_as_reference(lay.r, rseg, lay.d, dseg, lay.min_span)


def test_same_spans_as_reference_on_a_normal_pair() -> None:
    """A realistic shifted pair (new wrapper before the same evidence) gives the old spans, exact."""
    lay = normal_pair(4096)
    rseg, dseg = lay.tables()
    same_as_reference(lay.r, rseg, lay.d, dseg, lay.min_span)
    _, spans = find_spans(lay.r, rseg, lay.d, dseg, min_span=32)
    assert [(s.kind, s.length) for s in spans] == [("prefix", 30), ("shifted", 3996)]  # question: 30 < 32


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_work_stays_linear_on_adversarial_layouts_at_33000_tokens(name: str) -> None:
    """At the issue's 33,000 tokens every layout's counted work is within the linear bounds.

    NOTE: the old algorithm made 15,554,464 interval comparisons on blocks_seps here (about
    n^2 / 70); the new one makes at most a few per run and per piece.
    """
    lay = LAYOUTS[name](33_000)
    rseg, dseg = lay.tables()
    work = SpanWork()
    found = find_spans(lay.r, rseg, lay.d, dseg, min_span=lay.min_span, work=work)
    assert_bounded(found, work, len(lay.r), len(rseg.roles), len(dseg.roles), lay.min_span)
    assert work.steps <= 4 * len(lay.r)


def test_repeated_blocks_work_grows_linearly_where_the_old_grew_quadratically() -> None:
    """Doubling the repeated-blocks prompt doubles the new search's steps; the old comparisons quadrupled."""
    steps, old = [], []
    for n in (2048, 4096):
        lay = LAYOUTS["blocks_seps"](n)
        rseg, dseg = lay.tables()
        work = SpanWork()
        find_spans(lay.r, rseg, lay.d, dseg, min_span=32, work=work)
        steps.append(work.steps)
        counter = [0]
        reference_find_spans(lay.r, rseg, lay.d, dseg, min_span=32, counter=counter)
        old.append(counter[0])
    assert steps[1] <= 2.2 * steps[0]
    assert old[1] >= 3.5 * old[0] and old[1] > 100 * steps[1]


def test_only_undominated_runs_are_considered_on_repeated_blocks() -> None:
    """Each block's copies on the compared diagonals collapse to one considered run: one search per block."""
    lay = Layout(
        blocks(33 * 1000, 33, 100_000),
        one_segment(33_000),
        blocks(33 * 1000, 33, 1_000_000),
        one_segment(33_000),
    )
    rseg, dseg = lay.tables()
    work = SpanWork()
    _, spans = find_spans(lay.r, rseg, lay.d, dseg, min_span=32, work=work)
    assert work.runs > 8 * 900 and work.considered <= 1000  # NOTE: 8 donor copies meet each anchor
    assert len(spans) == 1000 and all(s.length == 32 for s in spans)


def test_span_count_is_bounded_by_segments_and_min_span() -> None:
    """Identical prompts with one-token segments give one prefix span per token, never more."""
    t = np.arange(5000, dtype=np.uint32)
    tab = SegmentTable.from_triples(per_token(5000))  # type: ignore[arg-type]
    lcp, spans = find_spans(t, tab, t.copy(), tab, min_span=32)
    assert lcp == 5000 and len(spans) == 5000 and all(s.length == 1 for s in spans)


def _counting_clock(ticks_before_expiry: int) -> tuple[Deadline, list[int]]:
    """A deadline whose clock reads 0 for ``ticks_before_expiry`` calls, then 10 (past it)."""
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        return 0.0 if calls[0] <= ticks_before_expiry else 10.0

    return Deadline(1.0, 1.0, clock), calls


def test_passed_deadline_stops_the_span_search() -> None:
    """A deadline already passed raises DeadlineExceeded before any span is searched."""
    lay = LAYOUTS["blocks_seps"](4096)
    rseg, dseg = lay.tables()
    with pytest.raises(DeadlineExceeded, match=r"token verification \(span search\) exceeded 0.5 s"):
        find_spans(lay.r, rseg, lay.d, dseg, min_span=32, deadline=Deadline(-1.0, 0.5, lambda: 0.0))


@pytest.mark.parametrize("ticks", [1, 2, 5, 12, 18])  # NOTE: a full search checks 19 times
def test_deadline_passing_mid_search_stops_it(ticks: int) -> None:
    """The deadline is checked inside the search (per diagonal, per 4,096 searches, ...), not only first."""
    lay = LAYOUTS["blocks_seps"](40_000)
    rseg, dseg = lay.tables()
    deadline, calls = _counting_clock(ticks)
    with pytest.raises(DeadlineExceeded):
        find_spans(lay.r, rseg, lay.d, dseg, min_span=32, deadline=deadline)
    assert calls[0] == ticks + 1  # stopped at the first check past the deadline


def test_deadline_not_reached_changes_nothing() -> None:
    """A deadline far away changes no span, and the clock is read a bounded number of times."""
    lay = LAYOUTS["blocks_seps"](40_000)
    rseg, dseg = lay.tables()
    deadline, calls = _counting_clock(10**9)
    assert find_spans(lay.r, rseg, lay.d, dseg, min_span=32, deadline=deadline) == find_spans(
        lay.r, rseg, lay.d, dseg, min_span=32
    )
    assert 3 <= calls[0] <= 3 + MAX_DIAGONALS + 40


def test_deadline_is_checked_while_splitting_a_long_prefix_at_many_segments() -> None:
    """A prefix cut into 20,000 one-token spans is stopped inside the split, not after it."""
    t = np.arange(20_000, dtype=np.uint32)
    tab = SegmentTable.from_triples(per_token(20_000))  # type: ignore[arg-type]
    deadline, calls = _counting_clock(2)  # entry check, first split check, then past
    with pytest.raises(DeadlineExceeded):
        find_spans(t, tab, t.copy(), tab, min_span=32, deadline=deadline)
    assert calls[0] == 3
