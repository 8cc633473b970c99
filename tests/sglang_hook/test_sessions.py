"""SGLang sessions (issue 31, section 7): a session never carries one scope's tokens or KV into a
request of another.

SGLang 0.5.23's ``Session.create_req`` builds a session request's prompt from the previous
request's prompt and output, under the *new* request's ``extra_key`` (and adapter and salt); a
streaming session also lends the previous request's KV to the next through
``StreamingSession.try_match_prefix``, which never looks at the tree key. The hook binds a session
to the tree key of the first request it sees in it and refuses any later request of another key
(and any streaming-session request), before a round matches or prefills it.
"""

from __future__ import annotations

from typing import Any

from engine_hooks.sglang.state import state_of


def _session(streaming: bool = False) -> Any:
    from sglang.srt.session.session_controller import Session

    return Session(capacity_of_str_len=1 << 16, session_id="s-1", streaming=streaming)


def _first_turn(h: Any, session: Any, seed: int = 81) -> tuple[Any, list[int]]:
    """Tenant acme's first request in ``session``, run to completion; it and its outputs."""
    from tests.sglang_hook.scenario import blocks

    lay = blocks(seed).donor()
    first = h.new_req("t1", lay.tokens, h.context(tenant="acme", segments=lay.segments), text=lay.text)
    first.session = session
    assert h.tree.hold_back([first]) == []
    h.run(first)
    first.output_ids = [5, 6, 7]
    h.finish(first, 3)
    return first, [*lay.tokens, 5, 6, 7]


def _next_turn(h: Any, session: Any, history: list[int], tenant: str, rid: str) -> Any:
    """A request continuing ``history`` in ``session`` (as ``Session.create_req`` builds it), of
    ``tenant``, seen by the prefill-round hook before any round matches it."""
    from sglang.srt.runtime_context import get_parallel

    req = h.new_req(rid, [*history, 9, 10, 11], h.context(tenant=tenant))
    req.session = session
    with get_parallel().override(tp_rank=0):  # NOTE: SGLang's abort logs on rank 0 (a server has one)
        h.tree.hold_back([req])
    return req


def test_a_session_never_carries_one_tenants_tokens_into_another_tenants_request(make_harness: Any) -> None:
    """Another tenant's request continuing acme's session is refused before any prefill: its prompt
    cut to one token, aborted, a tree key of its own, no context (no reuse, never a donor); acme's
    own next request in the session is served."""
    h = make_harness()
    session = _session()
    _, history = _first_turn(h, session)
    other = _next_turn(h, session, history, "globex", "t2")
    st = state_of(other)
    assert other.to_finish is not None and list(other.origin_input_ids) == [0]
    assert st is not None and st.context is None and "session-refused" in st.cache_key
    assert other.extra_key == st.cache_key and h.tree.stats["session_refused"] == 1
    own = _next_turn(h, session, history, "acme", "t3")
    own_st = state_of(own)
    assert own.to_finish is None and own_st is not None and own_st.context is not None
    assert len(own.origin_input_ids) == len(history) + 3


def test_a_streaming_session_request_is_refused_so_no_slot_kv_is_lent(make_harness: Any) -> None:
    """A request of a streaming session (whose slot KV SGLang lends without looking at the tree key)
    is refused before a match: SGLang then detaches it from the session and lends it nothing."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.session.streaming_session import SessionSlot

    h = make_harness()
    session = _session(streaming=True)
    slot = SessionSlot()
    slot.kv.req_pool_idx = 0  # NOTE: as if acme's first turn held KV in the session's slot
    h.tree.session.slots[session.session_id] = slot
    req = _next_turn(h, session, [1, 2, 3, 4], "globex", "t2")
    assert req.to_finish is not None and state_of(req) is not None
    key = RadixKey(req.origin_input_ids, req.extra_key)
    assert h.tree.session.try_match_prefix(MatchPrefixParams(key=key, req=req)) is None
    assert req.session is None and req.kv is not slot.kv
    h.tree.session.slots.clear()
