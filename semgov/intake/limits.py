"""Resource limits on everything semgov reads, each with a default, a setting and a clear error.

One frozen :class:`Limits` value carries them all. Every reader takes one (``limits=``);
``None`` means :meth:`Limits.from_env` (the defaults below, overridden by ``SEMGOV_MAX_*``
environment variables), so the ``semgov`` commands and the engine hook honour the same
settings. ``semgov check`` also takes flags, which win over the environment.

What happens when a limit is exceeded (docs/limits.md has the table):

- a captured line over ``max_line_bytes`` is a malformed line: reported with its line number,
  never read whole, and the donors it names (when a prefix of it tells) get a signed deny;
- a request with more than ``max_candidates`` candidates, or whose recipient prompt is over
  ``max_prompt_tokens`` or ``max_text_chars``, has every candidate denied; a donor prompt over
  them denies that candidate. The check runs before any fact is computed (no token hash, span
  search, signature check or PII scan), and the deny names the limit and how to raise it;
- a policy file or module over ``max_policy_bytes`` (or Rego modules over it in total), YAML
  nested deeper than ``max_yaml_depth`` or expanding (aliases included) to more than
  ``max_yaml_nodes`` nodes, and Rego nested deeper than ``max_rego_depth`` brackets are a
  :class:`~semgov.errors.PolicyError` naming ``file:line``.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from semgov.errors import InputError

if TYPE_CHECKING:
    from semgov.wire.models import Candidate, CapturedRequest, Prompt

MiB = 1024 * 1024
# NOTE: fixed by the wire types (``semgov.wire.models.Id``), not a setting: ids longer than this
# are refused when a captured request or provenance payload is validated.
MAX_ID_CHARS = 512
# PyYAML composes documents recursively: deeper settings would hit Python's recursion limit.
YAML_DEPTH_CEILING = 200
# regorus parses nested brackets in time exponential in the depth (about x2 per level):
# beyond this, loading one expression takes minutes or more.
REGO_DEPTH_CEILING = 24


class LimitError(InputError):
    """A limit setting is invalid, or an input exceeds a limit (the message names both)."""


@dataclass(frozen=True, slots=True)
class Setting:
    """How one limit is set: its field, environment variable, ``semgov check`` flag and unit."""

    field: str
    env: str
    flag: str | None
    unit: str
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "max_line_bytes",
        "SEMGOV_MAX_LINE_BYTES",
        "--max-line-bytes",
        "bytes",
        "longest captured-request line, newline excluded",
    ),
    Setting(
        "max_prompt_tokens",
        "SEMGOV_MAX_PROMPT_TOKENS",
        "--max-prompt-tokens",
        "tokens",
        "most token ids in one prompt (the recipient's or a donor's)",
    ),
    Setting(
        "max_text_chars",
        "SEMGOV_MAX_TEXT_CHARS",
        "--max-text-chars",
        "characters",
        "longest prompt text (the recipient's or a donor's; donor text is PII-scanned)",
    ),
    Setting(
        "max_candidates",
        "SEMGOV_MAX_CANDIDATES",
        "--max-candidates",
        "candidates",
        "most donor candidates in one request",
    ),
    Setting(
        "max_policy_bytes",
        "SEMGOV_MAX_POLICY_BYTES",
        "--max-policy-bytes",
        "bytes",
        "largest policy file or Rego module, and largest total of a policy's Rego modules",
    ),
    Setting(
        "max_yaml_depth",
        "SEMGOV_MAX_YAML_DEPTH",
        None,
        "levels",
        f"deepest nesting of YAML mappings and sequences (at most {YAML_DEPTH_CEILING})",
    ),
    Setting(
        "max_yaml_nodes",
        "SEMGOV_MAX_YAML_NODES",
        None,
        "nodes",
        "most YAML nodes in one document, each alias counted as the nodes it stands for",
    ),
    Setting(
        "max_rego_depth",
        "SEMGOV_MAX_REGO_DEPTH",
        None,
        "levels",
        f"deepest nesting of brackets ( [ {{ in a Rego module (at most {REGO_DEPTH_CEILING})",
    ),
)
_BY_FIELD = {s.field: s for s in SETTINGS}
_INT = re.compile(r"^[0-9]+(_[0-9]+)*$")


def _positive_int(raw: str) -> int | None:
    s = raw.strip()
    if not _INT.match(s):
        return None
    n = int(s)
    return n if n >= 1 else None


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits; every field is a positive integer (see :data:`SETTINGS`)."""

    max_line_bytes: int = 64 * MiB
    """Longest captured-request line in bytes, newline excluded (64 MiB)."""
    max_prompt_tokens: int = 262_144
    """Most token ids in one prompt, recipient or donor (256 Ki)."""
    max_text_chars: int = 2 * MiB
    """Longest prompt text in characters, recipient or donor (2 Mi: 8 per token at the token limit)."""
    max_candidates: int = 64
    """Most donor candidates in one request."""
    max_policy_bytes: int = 1 * MiB
    """Largest policy file or Rego module, and most all modules of a Rego policy may total (1 MiB)."""
    max_yaml_depth: int = 64
    """Deepest nesting of YAML mappings and sequences."""
    max_yaml_nodes: int = 100_000
    """Most nodes in one YAML document, aliases counted as the nodes they expand to."""
    max_rego_depth: int = 12
    """Deepest bracket nesting in a Rego module (the default policy needs 5)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise LimitError(f"{f.name} must be a positive integer, got {v!r}")
        if self.max_yaml_depth > YAML_DEPTH_CEILING:
            raise LimitError(
                f"max_yaml_depth must be at most {YAML_DEPTH_CEILING} (the YAML composer is recursive), "
                f"got {self.max_yaml_depth}"
            )
        if self.max_rego_depth > REGO_DEPTH_CEILING:
            raise LimitError(
                f"max_rego_depth must be at most {REGO_DEPTH_CEILING} (the Rego parser takes time "
                f"exponential in bracket nesting), got {self.max_rego_depth}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Limits:
        """The defaults, overridden by each ``SEMGOV_MAX_*`` variable that is set (``os.environ``)."""
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for s in SETTINGS:
            raw = env.get(s.env)
            if raw is None:
                continue
            n = _positive_int(raw)
            if n is None:
                raise LimitError(f"must be a positive integer ({s.unit}), got {raw!r}", field=s.env)
            values[s.field] = n
        try:
            return cls(**values)
        except LimitError as e:
            name = next((s.env for s in SETTINGS if e.message.startswith(s.field + " ")), None)
            raise LimitError(e.message, field=name) from None

    def with_overrides(self, **values: int | None) -> Limits:
        """A copy with the given fields replaced; ``None`` values are ignored (unset flags)."""
        given = {k: v for k, v in values.items() if v is not None}
        unknown = sorted(set(given) - set(_BY_FIELD))
        if unknown:
            raise LimitError(f"unknown limits {unknown}")
        return dataclasses.replace(self, **given)

    def describe(self, field: str) -> str:
        """``field = value``, and how to raise it (environment variable, and flag when there is one)."""
        s = _BY_FIELD[field]
        how = s.env if s.flag is None else f"{s.env} or `semgov check {s.flag}`"
        return f"{field} = {getattr(self, field)}; raise it with {how}"

    # ---- captured requests --------------------------------------------------------------------

    def prompt_problem(self, prompt: Prompt, what: str) -> str | None:
        """Why ``prompt`` (``what``: "recipient prompt", "donor 'r-03' prompt") is over a limit, if it is."""
        n = len(prompt.token_ids)
        if n > self.max_prompt_tokens:
            return f"{what} has {n} tokens, over the limit ({self.describe('max_prompt_tokens')})"
        if prompt.text is not None and len(prompt.text) > self.max_text_chars:
            return (
                f"{what} text has {len(prompt.text)} characters, over the limit "
                f"({self.describe('max_text_chars')})"
            )
        return None

    def request_problem(self, req: CapturedRequest) -> str | None:
        """Why the whole request is refused (too many candidates, recipient prompt too large), if it is."""
        n = len(req.candidates)
        if n > self.max_candidates:
            return f"request has {n} candidates, over the limit ({self.describe('max_candidates')})"
        return self.prompt_problem(req.prompt, "recipient prompt")

    def candidate_problem(self, cand: Candidate) -> str | None:
        """Why one candidate is refused (its donor prompt is too large), if it is."""
        return self.prompt_problem(cand.prompt, f"donor {cand.donor_id!r} prompt")


def resolve(limits: Limits | None) -> Limits:
    """``limits``, or the environment's (:meth:`Limits.from_env`) when None."""
    return limits if limits is not None else Limits.from_env()


def positive_int_arg(raw: str) -> int:
    """argparse ``type=`` for limit flags: a positive integer (underscores allowed)."""
    import argparse

    n = _positive_int(raw)
    if n is None:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {raw!r}")
    return n
