"""Chat messages to token ids and segments with SmolLM2's own tokenizer and chat template."""

from __future__ import annotations

import bisect
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semgov.gateway.prompt import ModelTokenizer, segments_of_spans
from semgov.gateway.tenants import Refusal
from tests.gateway.fixtures import tokenizer_dir

_TOK: list[ModelTokenizer] = []


def tok() -> ModelTokenizer:
    if not _TOK:
        _TOK.append(ModelTokenizer(tokenizer_dir()))
    return _TOK[0]


def template_ids(messages: list[dict[str, Any]]) -> list[int]:
    out = tok().hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out if isinstance(out, list) else out["input_ids"])


def tiles(segments: list[tuple[str, int, int]], n: int) -> bool:
    pos = 0
    for _, s, e in segments:
        if s != pos or e <= s:
            return False
        pos = e
    return pos == n


MESSAGES = [
    {"role": "system", "content": "You are a careful analyst."},
    {"role": "user", "content": "Summarize the filing below."},
    {"role": "user", "content": "Research file:\nRevenue 42M; margin 7.5%.\n"},
    {"role": "user", "content": "What was the margin?"},
]


def test_ids_are_the_templates_own_and_segments_follow_the_messages() -> None:
    """The ids equal apply_chat_template's; each message's text lies in the segment of its role."""
    p = tok().chat(MESSAGES, ["system", "instruction", "evidence", "question"])
    assert p.ids == template_ids(MESSAGES) and p.segmented
    assert [s[0] for s in p.segments] == ["system", "instruction", "evidence", "question"]
    assert tiles(p.segments, len(p.ids))
    for (_, s, e), m in zip(p.segments, MESSAGES, strict=True):
        assert m["content"].strip() in tok().hf.decode(p.ids[s:e])
    assert tok().hf.decode(p.ids[p.segments[-1][1] :]).endswith("<|im_start|>assistant\n")


def test_same_roles_in_a_row_merge_and_empty_messages_add_nothing() -> None:
    """Adjacent messages of one role form one segment; an empty message gets no segment."""
    msgs = [*MESSAGES[:2], {"role": "user", "content": ""}, *MESSAGES[2:]]
    p = tok().chat(msgs, ["system", "question", "question", "question", "question"])
    assert [s[0] for s in p.segments] == ["system", "question"] and tiles(p.segments, len(p.ids))


def test_content_the_template_rewrites_leaves_the_prompt_unsegmented() -> None:
    """A message whose text the rendered prompt does not contain: one `other` segment, still served."""
    t = ModelTokenizer(tokenizer_dir())
    t.hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | upper }}<|im_end|>{% endfor %}"
    )
    p = t.chat([{"role": "user", "content": "quiet words"}], ["question"])
    assert not p.segmented and p.segments == [("other", 0, len(p.ids))]
    assert "QUIET WORDS" in t.hf.decode(p.ids)


def test_a_model_without_a_chat_template_refuses_chat() -> None:
    """Without a chat template the chat route is refused with 400 naming /v1/completions."""
    t = ModelTokenizer.__new__(ModelTokenizer)
    t.has_template = False
    with pytest.raises(Refusal, match="/v1/completions"):
        t.render(MESSAGES)


def test_completion_text_spans_become_token_segments() -> None:
    """Character spans of a completion prompt become token segments that tile its ids."""
    text = "System: be brief.\nEvidence: the sky is blue.\nQ: what colour?"
    a, b = text.index("Evidence"), text.index("Q:")
    p = tok().text(text, [("system", 0, a), ("evidence", a, b), ("question", b, len(text))])
    assert [s[0] for s in p.segments] == ["system", "evidence", "question"] and tiles(p.segments, len(p.ids))
    assert "sky is blue" in tok().hf.decode(p.ids[p.segments[1][1] : p.segments[1][2]])


@pytest.mark.parametrize(
    "spans",
    [[("system", 0, 5)], [("system", 1, 61)], [("system", 0, 30), ("evidence", 31, 61)], [("secret", 0, 61)]],
)
def test_spans_that_do_not_tile_are_refused(spans: list[tuple[str, int, int]]) -> None:
    """Spans with a gap, an overlap, the wrong end or an unknown role get 400."""
    text = "x" * 61
    with pytest.raises(Refusal) as e:
        tok().text(text, spans)
    assert e.value.status == 400


def test_token_id_prompts_are_bounded_by_the_vocabulary() -> None:
    """Token ids outside the vocabulary are refused; in range, segments are in token offsets."""
    with pytest.raises(Refusal, match="token ids"):
        tok().token_ids([1, 2, 10**9], None)
    p = tok().token_ids([1, 2, 3, 4], [("evidence", 0, 3), ("question", 3, 4)])
    assert p.segments == [("evidence", 0, 3), ("question", 3, 4)]


def test_segments_of_spans_assigns_a_token_to_the_segment_it_starts_in() -> None:
    """A token straddling a boundary belongs to the segment of its first character."""

    def at(pos: int) -> int:
        return bisect.bisect_left([0, 3, 6], pos)

    assert segments_of_spans(at, [("a", 4), ("b", 9)], 3) == [("a", 0, 2), ("b", 2, 3)]
    assert segments_of_spans(at, [("a", 1), ("b", 9)], 3) == [("a", 0, 1), ("b", 1, 3)]


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _text})


@settings(max_examples=60, deadline=None)
@given(st.lists(_message, min_size=1, max_size=6), st.data())
def test_any_messages_give_the_templates_ids_and_tiling_segments(
    messages: list[dict[str, Any]], data: Any
) -> None:
    """For any messages (any Unicode), ids are apply_chat_template's and segments tile them."""
    roles = [
        data.draw(st.sampled_from(["system", "instruction", "evidence", "question", "other"]))
        for _ in messages
    ]
    try:
        expected = template_ids(messages)
    except Exception:  # noqa: BLE001 - SmolLM2's template refuses some orders; so must the gateway
        with pytest.raises(Refusal):
            tok().chat(messages, roles)
        return
    p = tok().chat(messages, roles)
    assert p.ids == expected and tiles(p.segments, len(p.ids))


_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>"]
_piece_text = st.lists(
    st.one_of(st.sampled_from(_SPECIALS), _text, st.text(alphabet=" \n\t.ab1<|>", max_size=20)), max_size=12
).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(_piece_text, min_size=1, max_size=4))
def test_piece_cache_encodes_exactly_as_the_whole_text(texts: list[str]) -> None:
    """Ids and token starts with the piece cache equal the tokenizer's on the whole text, cold and warm."""
    cache = tok().pieces
    assert cache.split is not None  # NOTE: SmolLM2's added tokens are verbatim: the cache is on
    cache.MIN_CHARS = 1  # type: ignore[misc]  # NOTE: cache every piece, so warm calls read the cache
    try:
        for text in [*texts, *texts, "".join(texts) * 3]:
            enc = tok().fast.encode(text, add_special_tokens=False)
            got = cache.encode(text)
            starts = [a for a, _ in enc.offsets]
            assert (got.ids, got.starts()) == (list(enc.ids), starts)
            for pos in range(len(text) + 1):  # NOTE: the boundary lookup equals a bisect over all starts
                assert got.first_token_at(pos) == bisect.bisect_left(starts, pos), pos
    finally:
        del cache.MIN_CHARS
