"""``semgov.facts.compute.prompt_from_tokens``: an engine's token array as a Prompt, validated as a whole."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from semgov.facts.compute import PreparedPrompt, prompt_from_tokens
from semgov.wire.models import Prompt

SEGS = [("system", 0, 3), ("evidence", 3, 7)]
IDS = [5, 0, 7, 2**32 - 1, 9, 9, 1]


def _validated(tokens: list[int], text: str | None = None, segs: Any = SEGS) -> Prompt:
    segments = [{"role": r, "start": a, "end": b} for r, a, b in segs]
    return Prompt.model_validate({"token_ids": tokens, "text": text, "segments": segments})


@pytest.mark.parametrize(
    "tokens",
    [array("q", IDS), np.array(IDS), list(IDS)],
    ids=["array-q", "numpy", "list"],
)
def test_builds_the_prompt_model_validate_builds(tokens: Any) -> None:
    """From array('q'), numpy or a list: equal to ``Prompt.model_validate`` of the same ids and segments."""
    got = prompt_from_tokens(tokens, "hi", SEGS)
    assert got == _validated(list(IDS), "hi")
    assert all(type(t) is int for t in got.token_ids)


def test_holds_the_ids_as_one_read_only_uint32_array_the_decision_uses() -> None:
    """The ids are a read-only uint32 copy of the engine's array; PreparedPrompt.of takes it as is"""
    engine = array("q", [5, 0, 7, 3, 9, 9, 1])
    p = prompt_from_tokens(engine, None, SEGS)
    prepared = PreparedPrompt.of(p)
    assert prepared.tokens is p.token_ids.array and prepared.tokens.dtype == np.uint32
    assert not prepared.tokens.flags.writeable and p.token_ids == [5, 0, 7, 3, 9, 9, 1]
    engine[0] = 8  # NOTE: the engine reusing its buffer changes nothing semgov holds
    assert p.token_ids[0] == 5 and PreparedPrompt.of(p).tokens.tolist() == [5, 0, 7, 3, 9, 9, 1]


@pytest.mark.parametrize(
    ("tokens", "segs", "match"),
    [
        (array("q", [5, -1, 7, 3, 9, 9, 1]), SEGS, "0..4294967295"),
        (np.array([5, 2**32, 7, 3, 9, 9, 1]), SEGS, "0..4294967295"),
        (np.array([[1, 2]]), [("system", 0, 2)], "flat integer"),
        (np.array([1.0, 2.0]), [("system", 0, 2)], "flat integer"),
        (array("q", [5, 0, 7, 3, 9, 9]), SEGS, "segments end at 7 but the prompt has 6 tokens"),
        (array("q", [5, 0, 7, 3, 9, 9, 1]), [("system", 0, 3), ("evidence", 4, 7)], "must tile"),
        (array("q", [5, 0, 7]), [("system", 0, 0), ("evidence", 0, 3)], "empty or reversed"),
    ],
    ids=["negative", "too-large", "2-d", "float", "short", "gap", "empty-segment"],
)
def test_refuses_what_model_validate_refuses(tokens: Any, segs: Any, match: str) -> None:
    """Ids out of range, a non-integer or nested array, segments that do not tile: refused, like the model."""
    with pytest.raises(ValueError, match=match):
        prompt_from_tokens(tokens, None, segs)
    if np.asarray(tokens).ndim == 1 and np.asarray(tokens).dtype.kind in "iu":
        with pytest.raises(ValidationError):
            _validated([int(t) for t in tokens], None, segs)


def test_refuses_an_unknown_role_and_a_non_string_text() -> None:
    """A role the model does not know and a text that is not a string are refused."""
    with pytest.raises(ValidationError):
        prompt_from_tokens(array("q", [1, 2]), None, [("wizard", 0, 2)])
    with pytest.raises(ValueError, match="text"):
        prompt_from_tokens(array("q", [1, 2]), b"bytes", [("system", 0, 2)])  # type: ignore[arg-type]


def test_a_prompt_constructed_from_a_plain_list_is_still_prepared() -> None:
    """Prompt.model_construct with a list (no semgov path does it) is still prepared (converted once)."""
    p = Prompt.model_construct(
        token_ids=[4, 5, 6], text=None, segments=_validated([4, 5, 6], None, [("other", 0, 3)]).segments
    )
    prepared = PreparedPrompt.of(p)
    assert prepared.tokens.dtype == np.uint32 and prepared.tokens.tolist() == [4, 5, 6]
