"""Ways to realize an approved shifted span, named, for the reference engine and its studies.

A shifted span's K/V were computed behind the donor's tokens; copied into the recipient (keys
re-rotated) they are close to what a cold prefill computes, not equal. A *realization* chooses which
of the span's tokens the engine computes instead of copying:

- ``none``: copy the whole span;
- ``leading:P%`` / ``leading:N``: its first tokens (the first realization the project shipped);
- ``boundary:N``: a fixed few first tokens after the boundary, whatever the span's length (EPIC's
  idea: the tokens right after a junction carry most of the error);
- ``trailing:N`` / ``trailing:P%``: its last tokens, those right before the question;
- ``bookend:H+T``: the first ``H`` and the last ``T``;
- ``selective:P%``: the same share of tokens chosen where the copy deviates most from the
  recipient's own context on a check layer (CacheBlend's idea, :mod:`~engine_hooks.reference.blend`).

Every one of them but ``selective`` is a head and a tail: the copied part is one run, which is what
the serving engines can carry out (a head costs SGLang one more prefill round and cannot be loaded
by vLLM's connector at all; a tail costs neither: the copy ends early). A tail is planned by ending
the approved span early (the positions after it are not approved, so every engine computes them);
a head by the span's signed ``recompute``. Prefix spans are exact and always copied whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine_hooks.reference import blend
from engine_hooks.reference import materialize as mz
from engine_hooks.reference.model import LoadedModel

_NUM = r"(\d+)(%?)"
_FORMS = {
    "none": re.compile(r"none"),
    "leading": re.compile(rf"leading:{_NUM}"),
    "boundary": re.compile(r"boundary:(\d+)()"),
    "trailing": re.compile(rf"trailing:{_NUM}"),
    "bookend": re.compile(r"bookend:(\d+)\+(\d+)"),
    "selective": re.compile(r"selective:(\d+)(%)"),
}


@dataclass(frozen=True)
class Method:
    """How a shifted span is realized: tokens computed at its head and its tail, or a selective
    share; counts are ``max`` of a fixed number and a percent of the span's length."""

    name: str
    head_tokens: int = 0
    head_percent: int = 0
    tail_tokens: int = 0
    tail_percent: int = 0
    selective_percent: int = 0

    @property
    def realizable_by_serving_engines(self) -> bool:
        """A head and a tail (one copied run): SGLang and, without a head, vLLM can carry it out."""
        return self.selective_percent == 0

    def head(self, length: int) -> int:
        return min(length, max(self.head_tokens, math.ceil(self.head_percent * length / 100)))

    def tail(self, length: int) -> int:
        return min(length, max(self.tail_tokens, math.ceil(self.tail_percent * length / 100)))


def parse(text: str) -> Method:
    """A :class:`Method` from its name (module docstring); ``ValueError`` naming the forms."""
    t = text.strip()
    for kind, rx in _FORMS.items():
        m = rx.fullmatch(t)
        if m is None:
            continue
        if kind == "none":
            return Method(t)
        a, b = m.group(1), m.group(2)
        if kind == "bookend":
            return Method(t, head_tokens=int(a), tail_tokens=int(b))
        pct = b == "%"
        n = int(a)
        if pct and n > 100:
            raise ValueError(f"{text!r}: a percent above 100")
        if kind in ("leading", "boundary"):
            return Method(t, head_percent=n) if pct else Method(t, head_tokens=n)
        if kind == "trailing":
            return Method(t, tail_percent=n) if pct else Method(t, tail_tokens=n)
        return Method(t, selective_percent=n)
    raise ValueError(
        f"not a realization: {text!r} (none, leading:P% or :N, boundary:N, trailing:N or :P%, bookend:H+T, "
        "selective:P%)"
    )


def plan(spans: Sequence[Mapping[str, Any]], how: Method) -> list[dict[str, Any]]:
    """The record-format spans to realize ``spans`` (an allow record's approved spans) as ``how``
    says: each shifted span ends ``tail`` tokens early and states its ``head`` as ``recompute``
    (its own signed ``recompute`` is overridden: this is the study's plan, not the policy's).
    A span left with no copied token is dropped. Prefix spans are kept whole (``recompute`` 0)."""
    out: list[dict[str, Any]] = []
    for s in spans:
        base = {k: s[k] for k in ("recipient_start", "donor_start", "length", "kind")}
        if s["kind"] != "shifted" or how.selective_percent:
            share = math.ceil(how.selective_percent * s["length"] / 100) if s["kind"] == "shifted" else 0
            out.append({**base, "recompute": min(s["length"], share)})
            continue
        n = int(s["length"])
        head, tail = how.head(n), how.tail(n)
        if head + tail >= n:
            continue
        out.append({**base, "length": n - tail, "recompute": head})
    return out


def realize(
    lm: LoadedModel,
    token_ids: list[int],
    donor: mz.DonorKV,
    spans: Sequence[Mapping[str, Any]],
    how: Method,
    *,
    decision_id: str,
    on_event: Callable[[mz.Realization], None] | None = None,
) -> tuple[mz.Prefill, mz.Realization]:
    """A warm prefill of ``token_ids`` from ``donor`` over ``spans`` realized as ``how`` says."""
    planned = sorted(plan(spans, how), key=lambda s: int(s["recipient_start"]))
    if how.selective_percent:
        return blend.blend_prefill(lm, token_ids, donor, planned, decision_id=decision_id, on_event=on_event)
    return mz.warm_prefill(lm, token_ids, donor, planned, decision_id=decision_id, on_event=on_event)
