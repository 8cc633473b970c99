"""Planning what a realization copies (pure): the front run and the regions past fresh tokens."""

from __future__ import annotations

from typing import Any

from engine_hooks.core.plan import Piece, Region, plan_pieces, plan_regions, recompute_leading


def _span(rs: int, ds: int, n: int, kind: str = "shifted") -> dict[str, Any]:
    return {"recipient_start": rs, "donor_start": ds, "length": n, "kind": kind}


def test_front_run_starts_at_the_exact_match_end_and_is_page_trimmed() -> None:
    """plan_pieces follows spans contiguous from start, cut at the limit and the live KV, page-trimmed."""
    spans = [_span(256, 320, 1000), _span(1256, 1400, 200)]
    assert plan_pieces(spans, 256, 2000, 5000, 1) == [
        Piece(256, 320, 1000, "shifted"),
        Piece(1256, 1400, 200, "shifted"),
    ]
    assert plan_pieces(spans, 256, 1300, 5000, 16) == [
        Piece(256, 320, 1000, "shifted"),
        Piece(1256, 1400, 40, "shifted"),  # 256 + 1040 = 1296, a page boundary
    ]
    assert plan_pieces(spans, 256, 2000, 1000, 1) == [
        Piece(256, 320, 680, "shifted")
    ]  # donor KV ends at 1000
    assert plan_pieces(spans, 200, 2000, 5000, 1) == []  # nothing approved at the exact-match end


def test_a_region_after_a_new_wrapper_starts_where_the_approved_span_starts() -> None:
    """[S][W'][E][Q']: E approved at 352 is a region when the front (256) has nothing approved."""
    spans = [_span(352, 320, 2048)]
    assert plan_pieces(spans, 256, 2431, 4000, 1) == []
    [r] = plan_regions(spans, 256, 2431, 4000, 1, max_regions=4, min_tokens=64)
    assert r == Region(352, (Piece(352, 320, 2048, "shifted"),)) and (r.length, r.end) == (2048, 2400)


def test_regions_start_on_page_boundaries_and_end_page_aligned() -> None:
    """With 16-token pages a region starts at the next page boundary inside its span and ends on one."""
    [r] = plan_regions([_span(350, 318, 1000)], 256, 4000, 4000, 16, max_regions=4, min_tokens=64)
    assert r.start == 352 and r.start % 16 == 0 and r.end % 16 == 0
    assert r.pieces == (Piece(352, 320, 992, "shifted"),)


def test_several_regions_in_prompt_order_bounded_by_max_regions_and_min_tokens() -> None:
    """|fresh|E1|fresh|E2|fresh|tiny|: two regions; a 40-token run is not worth a chunk; max_regions caps."""
    spans = [_span(100, 90, 500), _span(700, 650, 800), _span(1600, 1500, 40)]
    regions = plan_regions(spans, 50, 3000, 5000, 1, max_regions=4, min_tokens=64)
    assert [(r.start, r.length) for r in regions] == [(100, 500), (700, 800)]
    assert [
        (r.start, r.length) for r in plan_regions(spans, 50, 3000, 5000, 1, max_regions=1, min_tokens=64)
    ] == [(100, 500)]
    assert plan_regions(spans, 50, 3000, 5000, 1, max_regions=0, min_tokens=64) == []


def test_regions_never_overlap_the_front_run_nor_pass_the_limit_or_the_donor() -> None:
    """A region starts strictly after start, stops at the limit (last token computed) and at live KV."""
    spans = [_span(0, 0, 300), _span(400, 500, 1000)]
    regions = plan_regions(spans, 300, 1200, 1300, 1, max_regions=4, min_tokens=64)
    assert [(r.start, r.end) for r in regions] == [(400, 1200)]  # limit 1200
    regions = plan_regions(spans, 300, 5000, 1000, 1, max_regions=4, min_tokens=64)
    assert [(r.start, r.end) for r in regions] == [(400, 900)]  # donor KV ends at 1000 = donor pos 500 + 500
    assert all(r.start > 300 for r in plan_regions(spans, 300, 5000, 5000, 1, max_regions=4, min_tokens=1))


def test_planning_stays_bounded_for_many_tiny_spans() -> None:
    """Ten thousand one-token spans (well-formed, signed or not) plan in bounded work and yield no region."""
    spans = [_span(2 * i, 2 * i, 1) for i in range(10_000)]
    assert plan_regions(spans, 0, 30_000, 30_000, 1, max_regions=4, min_tokens=64) == []


def test_recompute_leading_leaves_out_the_head_of_shifted_spans_only() -> None:
    """5% of each shifted span's head (rounded up) goes to the model; prefix spans, share 0: unchanged."""
    spans = [_span(0, 0, 256, "prefix"), _span(320, 256, 1000), _span(1400, 1300, 10)]
    assert recompute_leading(spans, 0.0) == spans
    assert recompute_leading(spans, 0.05) == [
        _span(0, 0, 256, "prefix"),
        _span(370, 306, 950),
        _span(1401, 1301, 9),
    ]
    assert recompute_leading([_span(5, 0, 3)], 1.0) == []


def test_recompute_leading_follows_the_records_plan_with_the_setting_as_a_floor() -> None:
    """Each span's signed ``recompute`` head is left out; the setting only ever adds to a shifted span's."""
    planned = [{**_span(0, 0, 256, "prefix"), "recompute": 0}, {**_span(320, 256, 1000), "recompute": 100}]
    assert recompute_leading(planned) == [_span(0, 0, 256, "prefix"), _span(420, 356, 900)]
    assert recompute_leading(planned, 0.05) == [_span(0, 0, 256, "prefix"), _span(420, 356, 900)]  # 50 < 100
    assert recompute_leading(planned, 0.2) == [_span(0, 0, 256, "prefix"), _span(520, 456, 800)]  # 200 > 100
    whole = [{**_span(320, 256, 40), "recompute": 40}, {**_span(400, 400, 64, "prefix"), "recompute": 8}]
    assert recompute_leading(whole) == [_span(408, 408, 56, "prefix")]  # a prefix span's plan counts too


def test_why_an_allow_realizes_nothing() -> None:
    """The reason an allow is not acted on: nothing past the exact match (None: SGLang has it all),
    everything past it recomputed or turned off, regions off, or runs too short for a region."""
    from engine_hooks.core.plan import unrealizable_reason

    kw: dict[str, Any] = {"max_regions": 4, "min_region_tokens": 64, "page_size": 1}
    prefix = [_span(0, 0, 256, "prefix")]
    assert unrealizable_reason(prefix, prefix, 256, **kw) is None
    e = [_span(352, 320, 2048)]
    assert "may be copied" in str(unrealizable_reason(e, [], 256, **kw))
    off = unrealizable_reason(e, e, 256, **{**kw, "max_regions": 0})
    assert off is not None and "starts at 352, after fresh tokens" in off and "SEMGOV_MAX_REGIONS is 0" in off
    short = [_span(352, 320, 40)]
    assert "shorter than SEMGOV_MIN_REGION_TOKENS (64)" in str(unrealizable_reason(short, short, 256, **kw))
