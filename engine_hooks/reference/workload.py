"""What the synthetic workloads share, defined once.

Three builders use it: the example capture (``examples/generate_workload.py``), the
`semgov bench` pairs (:mod:`engine_hooks.reference.bench_workload`) and the benchmarks'
token-level requests (``benchmarks/_workloads.py``, ``benchmarks/side_channel.py``). Their
content differs on purpose (a word-level toy tokenizer and a full research file for the
example, the model's chat template and answerable questions for the bench, random token ids
for the latency benchmarks); the cohort design, the entities and tasks, and the way prompts,
provenance, candidates and captured requests are put together are the same, and live here.

Imports nothing beyond semgov's own dependencies (no torch), so the example generator runs
after a plain ``pip install -e .``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, SupportsInt

from semgov import provenance_payload

Json = dict[str, Any]
Tokenize = Callable[[str], list[int]]

START = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
TTL = timedelta(days=7)  # a donor's provenance expires this long after it was created
POLICY_VERSION = "default@1"
VOCAB_SIZE = 49152  # SmolLM2's vocabulary size
TENANTS = ("acme", "globex", "initech")

# --- cohorts ----------------------------------------------------------------------------------

REALISTIC_DESIGN: dict[str, tuple[str, tuple[float, float]]] = {
    # realistic cohort: (expected decision under the default policy, similarity range a semantic
    # cache would report)
    "exact": ("allow", (0.97, 1.0)),
    "question": ("allow", (0.75, 0.9)),
    # NOTE: safe to reuse, but shifted spans are off by default for answer quality (QUALITY_GATED)
    "shifted": ("deny", (0.85, 0.95)),
    "removed_wrapper": ("deny", (0.85, 0.95)),
    "instruction": ("deny", (0.8, 0.92)),
    "task": ("deny", (0.65, 0.82)),
    "entity_swap": ("deny", (0.7, 0.85)),
    "unrelated": ("deny", (0.2, 0.55)),
}
ALLOW_BASES = ("exact", "question")  # the pairs a single-gate mutation starts from
# Cohorts whose reuse breaks no boundary but whose shifted spans the default policy turns off for
# answer quality: materializing them is a quality risk, not an unsafe reuse.
QUALITY_GATED = frozenset({"shifted", "removed_wrapper"})


def expected(cohort: str) -> str:
    """The decision the cohort's design expects: a mutation of an allow pair is always denied."""
    return REALISTIC_DESIGN[cohort][0] if cohort in REALISTIC_DESIGN else "deny"


# --- entities and tasks -----------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """A task with three instruction templates (the third asks for revision 2 of the contract)."""

    id: str
    contract: str
    templates: tuple[str, str, str]
    questions: tuple[str, ...]  # templates with ``{name}`` (and ``{pos}``, its possessive)
    facts: tuple[str, ...] = ()  # per question, the fact key of the value it asks for (if any)


@dataclass(frozen=True)
class Entity:
    """A company: its own namespace in one tenant and its research file (the evidence)."""

    index: int
    tenant: str
    namespace: str
    name: str
    evidence: str
    values: dict[str, str] = field(default_factory=dict, hash=False)  # fact key -> value as written


def entity_namespace(index: int) -> str:
    return f"research/entity-{index:03d}"


def ticker(name: str) -> str:
    """``Granite Holdings`` -> ``GRAH``."""
    first, second = name.split()[:2]
    return (first[:3] + second[0]).upper()


def possessive(name: str) -> str:
    return name + ("'" if name.endswith("s") else "'s")


def question_text(task: Task, question: int, name: str) -> str:
    return task.questions[question].format(name=name, pos=possessive(name))


def musd(x: float, digits: int = 1) -> str:
    """A figure in millions of US dollars as the research files write it: ``$4,182.7 million``."""
    return f"${x:,.{digits}f} million"


def contract_ref(schemas: Mapping[tuple[str, int], str], task: Task, template: int) -> Json:
    """The task's response contract for an instruction template: template 2 asks for revision 2."""
    schema = schemas[(task.contract, 2 if template == 2 else 1)]
    return {"id": task.contract, "schema_sha256": hashlib.sha256(schema.encode()).hexdigest()}


def rfc3339(dt: datetime) -> str:
    """Whole seconds, ``Z``: the workloads' times never carry a fraction."""
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


# --- prompts, provenance, requests ------------------------------------------------------------


def segment_tokens(parts: Iterable[tuple[str, Sequence[int]]]) -> tuple[list[int], list[Json]]:
    """The token ids of ``(role, token ids)`` parts, concatenated, and their role segments."""
    ids: list[int] = []
    segments: list[Json] = []
    for role, toks in parts:
        segments.append({"role": role, "start": len(ids), "end": len(ids) + len(toks)})
        ids.extend(toks)
    return ids, segments


def token_prompt(parts: Iterable[tuple[str, Iterable[SupportsInt]]]) -> Json:
    """A text-less prompt from ``(role, token ids)`` parts (numpy arrays too)."""
    ids, segments = segment_tokens((role, [int(x) for x in toks]) for role, toks in parts)
    return {"token_ids": ids, "segments": segments}


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def donor_payload(
    *,
    donor_id: str,
    tenant: str,
    namespace: str,
    task_id: str,
    contract: Json,
    created_at: datetime,
    prompt: Mapping[str, Any],
    changes: Mapping[str, Any] | None = None,
) -> Json:
    """The provenance payload of a donor ``prompt`` (wire form), valid for :data:`TTL` under
    :data:`POLICY_VERSION`, with ``changes`` applied (even invalid ones) before anyone signs it."""
    payload = provenance_payload(
        donor_id=donor_id,
        tenant=tenant,
        namespace=namespace,
        task={"id": task_id, "version": "1"},
        response_contract=contract,
        created_at=created_at,
        expires_at=created_at + TTL,
        policy_version=POLICY_VERSION,
        token_ids=prompt["token_ids"],
        segments=prompt["segments"],
        text=prompt.get("text"),
    )
    payload.update(changes or {})
    return payload


def candidate(donor_id: str, similarity: float, prompt: Json, provenance: Json) -> Json:
    return {"donor_id": donor_id, "similarity": similarity, "prompt": prompt, "provenance": provenance}


def captured_json(
    *,
    request_id: str,
    received_at: datetime,
    tenant: str,
    namespace: str,
    task_id: str,
    contract: Json,
    prompt: Json,
    candidates: list[Json],
    expect: dict[str, str] | None = None,
) -> Json:
    """A ``semgov.captured_request/v1`` as JSON data; ``expect`` only when given."""
    request: Json = {
        "schema": "semgov.captured_request/v1",
        "request_id": request_id,
        "received_at": rfc3339(received_at),
        "tenant": tenant,
        "namespace": namespace,
        "task": {"id": task_id, "version": "1"},
        "response_contract": contract,
        "prompt": prompt,
        "candidates": candidates,
    }
    if expect is not None:
        request["expect"] = expect
    return request
