"""``TokenIds``: a prompt's ids as one read-only uint32 array, validated and serialized as the old list."""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np
import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from semgov.facts.token_ids import TokenIds
from semgov.wire.models import Prompt, TokenId


class _OldPrompt(BaseModel):
    """The field as it was: ``list[TokenId]`` under the same strict config, the reference for errors."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    token_ids: list[TokenId]


class _NewPrompt(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    token_ids: TokenIds


BAD: list[Any] = [[1, -2, 3], [1, True], [0, 2**32], "123", [1.0], [None], {"a": 1}, [[1]], 7, [1, "2"]]


def _errors(model: type[BaseModel], value: Any, *, json_mode: bool) -> list[tuple[Any, ...]]:
    with pytest.raises(ValidationError) as e:
        if json_mode:
            model.model_validate_json(json.dumps({"token_ids": value}))
        else:
            model.model_validate({"token_ids": value})
    return [(x["type"], x["loc"], x["msg"]) for x in e.value.errors(include_url=False)]


@pytest.mark.parametrize("json_mode", [True, False], ids=["json", "python"])
@pytest.mark.parametrize("value", BAD, ids=[repr(v) for v in BAD])
def test_refuses_what_the_list_field_refused_with_the_same_errors(value: Any, json_mode: bool) -> None:
    """Every bad id list gets exactly the errors (type, location, message) list[TokenId] gave it."""
    assert _errors(_NewPrompt, value, json_mode=json_mode) == _errors(_OldPrompt, value, json_mode=json_mode)


def test_serializes_to_the_same_list_and_json_and_round_trips() -> None:
    """model_dump and model_dump_json give the old list; parsing that JSON again gives an equal prompt."""
    ids = [5, 0, 2**32 - 1, 7]
    new, old = _NewPrompt.model_validate({"token_ids": ids}), _OldPrompt.model_validate({"token_ids": ids})
    assert new.model_dump() == old.model_dump() == {"token_ids": ids}
    assert new.model_dump_json() == old.model_dump_json()
    assert _NewPrompt.model_validate_json(new.model_dump_json()) == new
    assert _NewPrompt.model_json_schema()["properties"] == _OldPrompt.model_json_schema()["properties"]


def test_behaves_as_an_immutable_sequence_of_ints() -> None:
    """len, indexing, slicing (a list), iteration (ints), equality with lists, tuples and TokenIds."""
    t = TokenIds(np.array([3, 1, 4, 1, 5]))
    assert len(t) == 5 and t[0] == 3 and t[-1] == 5 and type(t[1]) is int
    assert t[1:3] == [1, 4] and list(t) == [3, 1, 4, 1, 5] and all(type(x) is int for x in t)
    assert t == [3, 1, 4, 1, 5] and [3, 1, 4, 1, 5] == t and t == (3, 1, 4, 1, 5)
    assert t != [3, 1, 4, 1] and t != [3, 1, 4, 1, 6] and t == TokenIds(np.array([3, 1, 4, 1, 5]))
    assert t.count(1) == 2 and t.index(4) == 2 and 5 in t
    with pytest.raises(ValueError, match="read-only"):
        t.array[0] = 9
    with pytest.raises(TypeError):
        hash(t)
    assert pickle.loads(pickle.dumps(t)) == t


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (np.array([1, -1]), "0..4294967295"),
        (np.array([2**32]), "0..4294967295"),
        (np.array([[1, 2]]), "flat integer"),
        (np.array([1.5]), "flat integer"),
        ([1, 2], "flat integer"),
    ],
    ids=["negative", "too-large", "2-d", "float", "list"],
)
def test_constructor_refuses_ids_it_cannot_hold_exactly(value: Any, match: str) -> None:
    """An id outside 0..2**32-1 is refused (never wrapped); only flat integer arrays are taken."""
    with pytest.raises(ValueError, match=match):
        TokenIds(value)


def test_prompt_from_json_holds_an_array_equal_to_the_ids() -> None:
    """A Prompt parsed from JSON holds its ids as a read-only uint32 array equal to the JSON list."""
    p = Prompt.model_validate_json(
        '{"token_ids": [9, 8, 7], "segments": [{"role": "other", "start": 0, "end": 3}]}'
    )
    assert isinstance(p.token_ids, TokenIds) and p.token_ids.array.dtype == np.uint32
    assert p.token_ids.array.tolist() == [9, 8, 7] and not p.token_ids.array.flags.writeable
