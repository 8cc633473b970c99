"""``TokenIds``: a prompt's token ids as one read-only uint32 array, validated and serialized as a list.

A prompt of 18k tokens held as a Python list costs ~650 KB and a conversion (~0.2 ms) each time
numpy needs it; the engine hands semgov an integer array in the first place. ``Prompt.token_ids``
is therefore this immutable sequence: JSON and Python lists are validated item by item exactly as
``list[TokenId]`` was (same errors, same locations), then stored as one array; an engine's array is
taken after one whole-array range check (:func:`semgov.facts.compute.prompt_from_tokens`); it serializes
back to the same JSON list.
"""

from __future__ import annotations

import array as pyarray
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, overload

import numpy as np
import numpy.typing as npt
from pydantic import Field, GetCoreSchemaHandler
from pydantic_core import core_schema as cs

_MAX = 0xFFFFFFFF


class TokenIds(Sequence[int]):
    """An immutable sequence of token ids (0..2**32-1) backed by a read-only uint32 array.

    NOTE: compares equal to a list or tuple of the same ints and to another ``TokenIds``; slicing
    gives a list. The array is never written after construction (``writeable`` is off).
    """

    __slots__ = ("_a",)

    def __init__(self, ids: npt.NDArray[np.integer[Any]]) -> None:
        """From a flat integer array, copied (so nobody else can change it); :class:`ValueError` for
        another shape or dtype, or an id outside 0..2**32-1 (never wrapped into range)."""
        if not isinstance(ids, np.ndarray) or ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError("token ids must be a flat integer array")
        if ids.dtype != np.uint32 and ids.size and (int(ids.min()) < 0 or int(ids.max()) > _MAX):
            raise ValueError("token ids must be in 0..4294967295")
        a = np.array(ids, dtype=np.uint32)  # NOTE: always a copy, our own buffer
        a.flags.writeable = False
        self._a = a

    @classmethod
    def from_list(cls, ids: Sequence[int]) -> TokenIds:
        """From already validated ints (``array.array`` converts a list ~3x faster than numpy)."""
        return cls(np.frombuffer(pyarray.array("I", ids), dtype=np.uint32))

    @property
    def array(self) -> npt.NDArray[np.uint32]:
        """The ids as a read-only uint32 array (no copy)."""
        return self._a

    def tolist(self) -> list[int]:
        return self._a.tolist()  # type: ignore[no-any-return]

    def __len__(self) -> int:
        return len(self._a)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            return self._a[i].tolist()  # type: ignore[no-any-return]
        return int(self._a[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self._a.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return bool(np.array_equal(self._a, other._a))
        if isinstance(other, list | tuple):
            return len(other) == len(self._a) and self._a.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # NOTE: like the list it replaces

    def __repr__(self) -> str:
        return f"TokenIds({self._a.tolist()!r})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> npt.NDArray[Any]:
        return self._a if dtype is None else self._a.astype(dtype)

    def __reduce__(self) -> tuple[Callable[..., TokenIds], tuple[bytes]]:
        return (_from_bytes, (self._a.tobytes(),))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> cs.CoreSchema:
        # NOTE: the items are validated by pydantic itself, exactly as list[TokenId] validated them
        # (strict ints, 0..2**32-1, errors at token_ids.<i>); only then is the list stored as an array.
        item = handler.generate_schema(Annotated[int, Field(ge=0, le=_MAX)])
        from_list = cs.no_info_after_validator_function(cls.from_list, cs.list_schema(item))

        def python(value: Any, validate: cs.ValidatorFunctionWrapHandler) -> TokenIds:
            return value if isinstance(value, TokenIds) else validate(value)

        return cs.json_or_python_schema(
            json_schema=from_list,
            python_schema=cs.no_info_wrap_validator_function(python, from_list),
            serialization=cs.plain_serializer_function_ser_schema(
                TokenIds.tolist, return_schema=cs.list_schema(cs.int_schema())
            ),
        )


def _from_bytes(raw: bytes) -> TokenIds:
    return TokenIds(np.frombuffer(raw, dtype="<u4"))
