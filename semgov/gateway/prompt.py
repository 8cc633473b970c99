"""What the prompt is: chat messages to the token ids the engine serves, and their segments.

The gateway sends token ids, never text, so the engine cannot tokenize differently from the
segments the token names. A chat request is rendered with the model's own chat template
(``apply_chat_template``, generation prompt added), the whole text is tokenized once with the
model's own tokenizer (no special tokens added: the template writes them, as
``apply_chat_template(tokenize=True)`` does), and each token belongs to the segment its first
character lies in. Message *i*'s segment runs from the end of message *i-1*'s content to the end
of its own (so the template's markup before a message belongs to it), and the last one runs to
the end of the text (the generation prompt). A BPE token that spans a boundary belongs to the
segment it starts in; a segment left without a token is dropped. The segments therefore tile the
token ids, in order, from 0: what :mod:`semgov.context` requires.

Roles: each message gets a segment role by its chat role (:data:`ROLE_DEFAULTS`), or the one the
client marked for it (``semgov.segments``: ``[{"message": i, "role": r}]``).

A template that does not copy a message's content verbatim (it rewrites or drops it) cannot be
segmented: the prompt is then one ``other`` segment (:attr:`Prompt.segmented` False), which is
served but gets no shifted reuse.
"""

from __future__ import annotations

import bisect
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semgov.gateway.tenants import Refusal

__all__ = ["ROLE_DEFAULTS", "ROLES", "ModelTokenizer", "Prompt", "segments_of_spans"]

ROLES = ("system", "instruction", "evidence", "question", "other")
ROLE_DEFAULTS = {
    "system": "system",
    "developer": "instruction",
    "user": "question",
    "assistant": "other",
    "tool": "evidence",
}


@dataclass(frozen=True, slots=True)
class Prompt:
    """Token ids and the ``(role, start, end)`` segments tiling them."""

    ids: list[int]
    segments: list[tuple[str, int, int]]
    segmented: bool = True
    text: str | None = None  # the rendered text the ids are the tokenization of (None: ids sent)


@dataclass(frozen=True, slots=True)
class Encoded:
    """The token ids of a text, and where its tokens start, kept per piece (no list of every start).

    ``pieces``: ``(first character, first token, token starts relative to the piece)``, in order."""

    ids: list[int]
    pieces: list[tuple[int, int, Sequence[int]]]

    def starts(self) -> list[int]:
        """Where each token starts in the text."""
        return [c + a for c, _, rel in self.pieces for a in rel]

    def first_token_at(self, pos: int) -> int:
        """The index of the first token that starts at or after character ``pos`` (``len(ids)`` if none)."""
        i = bisect.bisect_right([c for c, _, _ in self.pieces], pos) - 1
        if i < 0:
            return 0
        chars, first, rel = self.pieces[i]
        j = bisect.bisect_left(rel, pos - chars)
        if j < len(rel):
            return first + j
        return self.pieces[i + 1][1] if i + 1 < len(self.pieces) else len(self.ids)


def segments_of_spans(
    first_token_at: Callable[[int], int], spans: Sequence[tuple[str, int]], n_tokens: int
) -> list[tuple[str, int, int]]:
    """Token segments of character ``spans`` (``(role, end)``, in order, the last ending at the
    text's end), given where the first token at or after a character is (non-decreasing)."""
    out: list[tuple[str, int, int]] = []
    lo = 0
    for i, (role, end) in enumerate(spans):
        hi = n_tokens if i == len(spans) - 1 else max(lo, first_token_at(end))
        if hi > lo:
            if out and out[-1][0] == role:
                out[-1] = (role, out[-1][1], hi)
            else:
                out.append((role, lo, hi))
        lo = max(lo, hi)
    return out


class ModelTokenizer:
    """The model's own tokenizer and chat template, loaded from a local directory (no download)."""

    def __init__(self, directory: Path, *, cache_chars: int = 32 << 20) -> None:
        from transformers import AutoTokenizer

        self.directory = directory
        self.hf: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.fast: Any = self.hf.backend_tokenizer  # NOTE: transformers' fast tokenizers only
        self.vocab_size = int(self.fast.get_vocab_size(with_added_tokens=True))
        self.has_template = bool(getattr(self.hf, "chat_template", None))
        self.pieces = PieceCache(self.fast, cache_chars)

    def encode(self, text: str) -> Encoded:
        """Token ids of ``text`` (no special tokens added) and where each token starts in it."""
        return self.pieces.encode(text)

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The chat template's text of ``messages`` with the generation prompt (raises :class:`Refusal`)."""
        if not self.has_template:
            raise Refusal(400, "no_chat_template", "the model has no chat template: use /v1/completions")
        try:
            text = self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - a template error (jinja raise_exception) is the client's
            raise Refusal(
                400, "chat_template", f"the chat template refused the messages: {str(e)[:200]}"
            ) from e
        if not isinstance(text, str):
            raise Refusal(400, "chat_template", "the chat template did not render text")
        return text

    def chat(self, messages: list[dict[str, Any]], roles: Sequence[str]) -> Prompt:
        """Token ids and segments of ``messages`` rendered by the chat template, one role per message."""
        text = self.render(messages)
        enc = self.encode(text)
        ids = enc.ids
        spans: list[tuple[str, int]] = []
        pos = 0
        for m, role in zip(messages, roles, strict=True):
            content = _text_of(m.get("content"))
            if not content:
                continue
            at = text.find(content, pos)
            if at < 0 and content.strip():
                content = content.strip()
                at = text.find(content, pos)
            if at < 0:
                return Prompt(ids, [("other", 0, len(ids))] if ids else [], segmented=False, text=text)
            pos = at + len(content)
            spans.append((role, pos))
        if not ids:
            raise Refusal(400, "empty_prompt", "the prompt has no tokens")
        if not spans:
            return Prompt(ids, [("other", 0, len(ids))], segmented=False, text=text)
        spans[-1] = (spans[-1][0], len(text))
        return Prompt(ids, segments_of_spans(enc.first_token_at, spans, len(ids)), text=text)

    def text(self, text: str, spans: Sequence[tuple[str, int, int]] | None) -> Prompt:
        """Token ids of a completion prompt, with segments from character ``spans`` tiling ``text``."""
        enc = self.encode(text)
        ids = enc.ids
        if not ids:
            raise Refusal(400, "empty_prompt", "the prompt has no tokens")
        if spans is None:
            return Prompt(ids, [("other", 0, len(ids))], segmented=False, text=text)
        _check_tiling(spans, len(text), "characters of the prompt")
        pieces = [(r, e) for r, _, e in spans]
        return Prompt(ids, segments_of_spans(enc.first_token_at, pieces, len(ids)), text=text)

    def token_ids(self, ids: list[int], spans: Sequence[tuple[str, int, int]] | None) -> Prompt:
        """A prompt the client sent as token ids, with segments in token offsets."""
        if not ids:
            raise Refusal(400, "empty_prompt", "the prompt has no tokens")
        if any(not 0 <= t < self.vocab_size for t in ids):
            raise Refusal(400, "token_id", f"prompt token ids must lie in [0, {self.vocab_size})")
        if spans is None:
            return Prompt(ids, [("other", 0, len(ids))], segmented=False)
        _check_tiling(spans, len(ids), "prompt tokens")
        return Prompt(ids, [(r, s, e) for r, s, e in spans if e > s])


class PieceCache:
    """``encode``, with the text between added tokens (``<|im_start|>``, ...) tokenized once per piece.

    A Hugging Face tokenizer splits its input on added tokens *before* it normalizes and
    pre-tokenizes, and tokenizes each piece on its own; so the ids of a text are the ids of its
    pieces, concatenated, with each added token's id between them. Long pieces repeat across
    requests (a retrieved document, a system prompt, the template's role headers), and this keeps
    their ids (LRU, at most ``max_chars`` characters of keys and :data:`MAX_ENTRIES` pieces). It
    is used only when that splitting is exact for this tokenizer: every added token is matched
    verbatim (not normalized, no ``lstrip``/``rstrip``/``single_word``), and a probe text encodes
    the same both ways; otherwise every call encodes the whole text.
    ``tests/gateway/test_prompt.py`` checks the equality on arbitrary texts.
    """

    MIN_CHARS = 1
    MAX_ENTRIES = 65536

    def __init__(self, fast: Any, max_chars: int) -> None:
        self.fast = fast
        self.max_chars = max_chars
        self.chars = 0
        self.hits = self.misses = 0
        self._cache: OrderedDict[str, tuple[list[int], list[int]]] = OrderedDict()
        added = {int(i): a for i, a in fast.get_added_tokens_decoder().items()}
        self.ids = {a.content: i for i, a in added.items()}
        verbatim = all(not (a.normalized or a.lstrip or a.rstrip or a.single_word) for a in added.values())
        names = sorted(self.ids, key=len, reverse=True)
        self.split = re.compile("|".join(map(re.escape, names))) if names and verbatim else None
        if self.split is not None:
            probe = "".join(f"{n} x{n}y \n {n}\n\n" for n in names[:8]) + " tail"
            enc = self._split_encode(probe)
            if (enc.ids, enc.starts()) != self._whole(probe):
                self.split = None

    def _whole(self, text: str) -> tuple[list[int], list[int]]:
        enc = self.fast.encode(text, add_special_tokens=False)
        return list(enc.ids), [a for a, _ in enc.offsets]

    def _piece(self, text: str) -> tuple[list[int], list[int]]:
        hit = self._cache.get(text) if len(text) >= self.MIN_CHARS else None
        if hit is not None:
            self.hits += 1
            self._cache.move_to_end(text)
            return hit
        hit = self._whole(text)
        self.misses += 1
        if self.MIN_CHARS <= len(text) <= self.max_chars:
            self._cache[text] = hit
            self.chars += len(text)
            while self.chars > self.max_chars or len(self._cache) > self.MAX_ENTRIES:
                old, _ = self._cache.popitem(last=False)
                self.chars -= len(old)
        return hit

    def _split_encode(self, text: str) -> Encoded:
        assert self.split is not None
        ids: list[int] = []
        pieces: list[tuple[int, int, Sequence[int]]] = []
        pos = 0
        for m in self.split.finditer(text):
            if m.start() > pos:
                got, rel = self._piece(text[pos : m.start()])
                pieces.append((pos, len(ids), rel))
                ids.extend(got)
            pieces.append((m.start(), len(ids), (0,)))
            ids.append(self.ids[m.group()])
            pos = m.end()
        if pos < len(text):
            got, rel = self._piece(text[pos:])
            pieces.append((pos, len(ids), rel))
            ids.extend(got)
        return Encoded(ids, pieces)

    def encode(self, text: str) -> Encoded:
        if self.split is None:
            ids, starts = self._whole(text)
            return Encoded(ids, [(0, 0, starts)])
        return self._split_encode(text)


def _check_tiling(spans: Sequence[tuple[str, int, int]], total: int, what: str) -> None:
    pos = 0
    for role, start, end in spans:
        if start != pos or end < start:
            raise Refusal(400, "segments", f"semgov.segments must tile the {what} in order from 0")
        if role not in ROLES:
            raise Refusal(400, "segments", f"segment role must be one of {', '.join(ROLES)}")
        pos = end
    if pos != total:
        raise Refusal(400, "segments", f"semgov.segments end at {pos}, the prompt has {total} {what}")


def _text_of(content: object) -> str:
    """A message's content as text: a string, or the text of its ``{"type": "text"}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""
