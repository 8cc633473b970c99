"""The `semgov bench` workload: donor/recipient pairs per cohort, tokenized with the real tokenizer.

A compact equivalent of ``examples/generate_workload.py`` (same tenants, tasks, contracts and
cohorts, built with the same pieces: :mod:`engine_hooks.reference.workload`) with two
differences that a model benchmark needs:

- prompts are the model's chat template, tokenized with the model's own tokenizer, one segment
  at a time (``system`` | ``instruction`` | ``evidence`` | ``question``); every segment but the
  first starts with its separator, so the concatenated segment tokens are exactly the
  tokenization of the whole prompt text (checked per prompt: :attr:`PromptSpec.consistent`);
- every evidence file embeds the values its questions ask for (e.g. "Revenue for the quarter
  ended September 30, 2026 was $4,182.7 million"), so answer quality is judged by whether the
  required value appears in the model's answer. The evidence is padded to the requested prompt
  length with earlier quarters' figures; the current quarter's figures come last, nearest the
  question.

The expected decision of a pair follows from how it was built, not from running semgov.
"""

# NOTE: long module: mostly data: the tasks' templates, the entity and evidence
# generators and the prompt builder of one benchmark workload.

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from engine_hooks.reference.workload import (
    ALLOW_BASES,
    REALISTIC_DESIGN,
    START,
    TENANTS,
    Entity,
    Json,
    Task,
    Tokenize,
    candidate,
    captured_json,
    contract_ref,
    donor_payload,
    entity_namespace,
    musd,
    question_text,
    rfc3339,
    segment_tokens,
    ticker,
)
from engine_hooks.reference.workload import expected as expected  # re-exported: tests and bench use it
from semgov import CapturedRequest, Keyring, SigningKey, sign_provenance
from semgov.signing.keys import TrustedKey

SYSTEM = {
    "acme": "You are the Acme Capital research assistant. Answer only from the evidence provided, "
    "cite figures exactly as written, and answer in one short sentence.",
    "globex": "You are the Globex Advisors research copilot. Be precise, never invent numbers, and "
    "answer in one short sentence that quotes the figure from the evidence.",
    "initech": "You are the Initech Wealth analyst assistant. Use only the supplied documents, keep "
    "units as written, and reply with one short sentence.",
}

SCHEMAS = {
    ("financials", 1): '{"type":"object","required":["metric","value"]}',
    ("financials", 2): '{"type":"object","required":["metric","value","unit","currency","fiscal_period"]}',
    ("risk_summary", 1): '{"type":"object","required":["risk","measure","quote"]}',
    ("risk_summary", 2): '{"type":"object","required":["risk","likelihood","impact","horizon","quote"]}',
}


def _task(id: str, contract: str, templates: tuple[str, str, str], asks: tuple[tuple[str, str], ...]) -> Task:
    """A task whose questions each ask for one fact: ``asks`` is (question template, fact key)."""
    return Task(id, contract, templates, tuple(q for q, _ in asks), tuple(f for _, f in asks))


TASKS = (
    _task(
        "extract_financials",
        "financials",
        (
            "Answer the analyst's question about the company in the research file below. Use only "
            "figures stated in the file and copy them exactly as written.",
            "Read the research file below, then answer the question that follows it. Quote the "
            "relevant figure exactly, with its unit, and do not estimate anything the file does not state.",
            "Answer the question below from the research file, giving every figure with its fiscal "
            "period and reporting currency, as the financials v2 record requires.",
        ),
        (
            ("What was {pos} revenue in the latest quarter?", "revenue"),
            ("What was {pos} operating margin in the latest quarter?", "op_margin"),
            ("What were {pos} diluted earnings per share for the latest quarter?", "eps"),
            ("How much cash and equivalents did {name} hold at the end of the latest quarter?", "cash"),
            ("How much free cash flow did {name} generate in the first nine months of fiscal 2026?", "fcf"),
            ("How many employees did {name} have at the end of the latest quarter?", "headcount"),
        ),
    ),
    _task(
        "summarize_risks",
        "risk_summary",
        (
            "Answer the question about the risks of the company in the research file below. Quote "
            "the figure from the file that measures the risk.",
            "Act as a credit analyst. Using only the research file below, answer the question that "
            "follows it and quote the supporting figure exactly as written.",
            "Answer the question below for the risk register v2, giving the figure together with its "
            "likelihood, impact and time horizon, quoted from the research file.",
        ),
        (
            ("What share of {pos} revenue came from its largest customer?", "customer"),
            ("What share of {pos} sales is invoiced in currencies other than the US dollar?", "fx"),
            ("How large are the notes {name} has coming due, in millions of dollars?", "notes"),
            ("Below what net leverage must {name} stay under its credit facility?", "covenant"),
            ("What was {pos} annualized employee attrition rate?", "attrition"),
            ("How many days of supply did {pos} inventory represent?", "inventory_days"),
        ),
    ),
)

SECTORS = {
    "industrial automation": (
        ("Motion Control", "Process Automation", "Aftermarket Services"),
        "a drives plant",
    ),
    "enterprise software": (
        ("Cloud Platform", "Subscription Licenses", "Professional Services"),
        "data centers",
    ),
    "specialty pharmaceuticals": (("Branded Products", "Generics", "Contract Manufacturing"), "a fill line"),
    "consumer goods": (("Home Care", "Personal Care", "Pet Nutrition"), "packaging automation"),
    "freight logistics": (("Truckload", "Intermodal", "Brokerage"), "tractor replacement"),
    "semiconductors": (("Analog", "Power Management", "Sensors"), "wafer capacity"),
}
REGIONS = ("North America", "Europe", "Asia Pacific", "Latin America")
NAMES = (
    "Granite Holdings",
    "Meridian Systems",
    "Larkspur Industries",
    "Tidewater Group",
    "Oakridge Technologies",
    "Vantage Brands",
    "Halcyon Partners",
    "Ironwood Corporation",
    "Juniper Holdings",
    "Northgate Systems",
    "Redfern Industries",
    "Silverton Group",
)

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3})")


def numbers_in(text: str) -> list[str]:
    """Numbers in ``text``, thousands separators removed ("$4,182.7 million" -> "4182.7")."""
    return _NUMBER.findall(_THOUSANDS.sub("", text))


def value_present(value: str, answer: str) -> bool:
    """Does ``answer`` state the number of ``value`` (a required value such as "$4,182.7 million")?"""
    want = numbers_in(value)
    return bool(want) and want[0] in numbers_in(answer)


# --- entities and evidence ------------------------------------------------------------------


def _core(name: str, ticker: str, sector: str, rng: random.Random) -> tuple[list[str], dict[str, str]]:
    """The current quarter's sentences (every required value) and the values by fact key."""
    u = rng.uniform
    segs, _ = SECTORS[sector]
    rev, growth = u(180, 6500), u(-6, 24)
    om = u(4, 30)
    eps = u(0.2, 6.5)
    cash, debt = rev * u(0.1, 0.6), rev * u(0.2, 1.4)
    head = rng.randrange(900, 48000, 10)
    v = {
        "revenue": musd(rev),
        "op_margin": f"{om:.1f}%",
        "eps": f"${eps:.2f}",
        "cash": musd(cash),
        "fcf": musd(rev * u(0.1, 0.5)),
        "headcount": f"{head:,}",
        "customer": f"{rng.randrange(4, 23)}%",
        "fx": f"{rng.randrange(24, 61)}%",
        "notes": musd(debt * u(0.2, 0.6)),
        "covenant": f"{u(3.5, 4.5):.1f} times",
        "attrition": f"{u(6, 19):.1f}%",
        "inventory_days": f"{rng.randint(45, 160)} days",
    }
    up = "up" if growth >= 0 else "down"
    sentences = [
        f"Latest results. Revenue for the quarter ended September 30, 2026 was {v['revenue']}, {up} "
        f"{abs(growth):.1f}% from a year earlier.",
        f"The operating margin for the quarter ended September 30, 2026 was {v['op_margin']}.",
        f"Diluted earnings per share for the quarter were {v['eps']}.",
        f"Cash and equivalents at quarter end were {v['cash']}, against total debt of {musd(debt)}.",
        f"Free cash flow for the first nine months of fiscal 2026 was {v['fcf']}.",
        f"{name} had {v['headcount']} employees at quarter end.",
        f"Risks. The largest customer accounted for {v['customer']} of revenue.",
        f"About {v['fx']} of sales are invoiced in currencies other than the US dollar.",
        f"Notes of {v['notes']} come due in {rng.randint(2027, 2030)}.",
        f"The credit facility requires net leverage below {v['covenant']}.",
        f"Employee attrition ran at {v['attrition']} annualized.",
        f"Inventory stood at {v['inventory_days']} of supply, mostly in the {segs[0]} segment.",
    ]
    return sentences, v


_MONTHS = {3: ("March", 31), 6: ("June", 30), 9: ("September", 30), 12: ("December", 31)}


def _quarters() -> Iterator[str]:
    """Quarter-end dates before the current quarter, newest first."""
    year, month = 2026, 6
    while True:
        name, day = _MONTHS[month]
        yield f"{name} {day}, {year}"
        month -= 3
        if month <= 0:
            month, year = 12, year - 1


def _history(sector: str, capex_use: str, rng: random.Random) -> Iterator[str]:
    """Earlier quarters' figures, newest first, as many as asked for."""
    segs, _ = SECTORS[sector]
    u = rng.uniform
    for q in _quarters():
        rev = u(150, 6000)
        income = musd(rev * u(0.03, 0.3))
        yield f"In the quarter ended {q}, revenue was {musd(rev)} and operating income {income}."
        for s in segs:
            seg_rev = musd(rev * u(0.15, 0.5))
            trend = rng.choice(("up", "down"))
            change = f"{u(0.5, 25):.1f}%"
            yield f"{s} revenue in the quarter ended {q} was {seg_rev}, {trend} {change} from a year earlier."
        yield f"Revenue from {rng.choice(REGIONS)} in the quarter ended {q} was {musd(rev * u(0.1, 0.4))}."
        bookings = musd(rev * u(0.8, 1.3))
        ratio = f"{u(0.8, 1.3):.2f}"
        yield f"Bookings in the quarter ended {q} totaled {bookings}, a book-to-bill ratio of {ratio}."
        capex = musd(rev * u(0.02, 0.09))
        yield f"Capital expenditure in the quarter ended {q} was {capex}, mostly for {capex_use}."


def make_entity(
    index: int, tokenize: Tokenize, evidence_tokens: int, rng: random.Random, *, tenant: str
) -> Entity:
    """A company with an evidence file of about ``evidence_tokens`` tokens (never below its core facts)."""
    name = NAMES[index % len(NAMES)]
    symbol = ticker(name)
    for _attempt in range(100):
        sector = rng.choice(sorted(SECTORS))
        core, values = _core(name, symbol, sector, rng)
        intro = f"{name} ({symbol}) is a {sector} company. Figures are in US dollars."
        n = len(tokenize(intro + " " + " ".join(core)))
        history: list[str] = []
        for s in _history(sector, SECTORS[sector][1], rng):
            if n >= evidence_tokens:
                break
            history.append(s)
            n += len(tokenize(" " + s))
        evidence = " ".join([intro, *history, *core])
        found = numbers_in(evidence)
        # Every required number must occur exactly once, so an answer stating it read it there.
        if all(found.count(numbers_in(v)[0]) == 1 for v in values.values()):
            return Entity(index, tenant, entity_namespace(index), name, evidence, values)
    raise RuntimeError("could not draw an evidence file with unique required values")


# --- prompts --------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromptSpec:
    """A prompt's token ids, text and role segments (segments tile the tokens)."""

    token_ids: list[int]
    text: str
    segments: list[Json]
    consistent: bool  # segment-wise tokens == tokenization of the whole text

    def wire(self) -> Json:
        return {"token_ids": self.token_ids, "text": self.text, "segments": self.segments}


def chat_parts(system: str, instruction: str, evidence: str, question: str) -> list[tuple[str, str]]:
    """ChatML (SmolLM2's template) split by role; each later segment starts with its separator."""
    return [
        ("system", f"<|im_start|>system\n{system}<|im_end|>\n"),
        ("instruction", f"<|im_start|>user\n{instruction}"),
        ("evidence", f"\n\nResearch file:\n{evidence}"),
        ("question", f"\n\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"),
    ]


class TextTokenizer:
    """A Hugging Face tokenizer as the workload uses it: ``tok(text)`` gives the token ids of
    ``text`` (no special tokens added; ``<|im_start|>`` in the text is one token), and
    :meth:`with_offsets` also gives where each token starts in ``text``."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [int(a) for a, _ in enc["offset_mapping"]]


def build_prompt(parts: Sequence[tuple[str, str]], tokenize: Tokenize) -> PromptSpec:
    """The prompt of ``(role, text)`` parts: its token ids are the tokenization of the whole text.

    With a :class:`TextTokenizer`, the whole text is tokenized once and each token belongs to the
    segment its first character is in (a BPE token may span a boundary, e.g. Qwen's ``".\\n\\n"``
    joins an instruction's last period to the separator of the next segment; a segment left with
    no token is dropped). Otherwise each part is tokenized on its own, and
    :attr:`PromptSpec.consistent` says whether that equals the whole text's tokenization.
    """
    text = "".join(t for _, t in parts)
    if isinstance(tokenize, TextTokenizer):
        ids, starts = tokenize.with_offsets(text)
        ends, pos = [], 0
        for _, t in parts:
            pos += len(t)
            ends.append(pos)
        roles: list[tuple[str, list[int]]] = [(role, []) for role, _ in parts]
        seg = 0
        for tid, start in zip(ids, starts, strict=True):
            while seg < len(ends) - 1 and start >= ends[seg]:
                seg += 1
            roles[seg][1].append(tid)
        got, segments = segment_tokens((r, t) for r, t in roles if t)
        assert got == ids  # NOTE: segments tile the whole text's tokens, in order
        return PromptSpec(ids, text, segments, consistent=True)
    ids, segments = segment_tokens((role, tokenize(text)) for role, text in parts)
    return PromptSpec(ids, text, segments, consistent=tokenize(text) == ids)


@dataclass(frozen=True)
class Call:
    """One request: a company, a task, an instruction template and a question."""

    entity: Entity
    task: Task
    template: int
    question: int
    received_at: datetime
    evidence_extra: str = ""

    @property
    def contract(self) -> Json:
        return contract_ref(SCHEMAS, self.task, self.template)

    @property
    def question_text(self) -> str:
        return question_text(self.task, self.question, self.entity.name)

    @property
    def required(self) -> list[str]:
        return [self.entity.values[self.task.facts[self.question]]]

    def prompt(self, tokenize: Tokenize) -> PromptSpec:
        e = self.entity
        return build_prompt(
            chat_parts(
                SYSTEM[e.tenant],
                self.task.templates[self.template] if self.template >= 0 else "",
                e.evidence + self.evidence_extra,
                self.question_text,
            ),
            tokenize,
        )


# --- cohorts --------------------------------------------------------------------------------

# cohort: (expected decision, similarity range), in the order the bench runs and reports them
REALISTIC = {
    c: REALISTIC_DESIGN[c]
    for c in (
        "exact",
        "shifted",
        "removed_wrapper",
        "question",
        "instruction",
        "task",
        "entity_swap",
        "unrelated",
    )
}
MUTATIONS = ("other_tenant", "expired", "stale_policy", "tampered", "unknown_key", "pii_text")
COHORTS = (*REALISTIC, *MUTATIONS)


@dataclass(frozen=True)
class BenchKeys:
    """Throwaway Ed25519 keys: ``k1`` trusted provenance key, ``k9`` outside the keyring, decision key."""

    k1: SigningKey
    k9: SigningKey
    decision: SigningKey
    keyring: Keyring

    @classmethod
    def generate(cls) -> BenchKeys:
        k1 = SigningKey.from_private(Ed25519PrivateKey.generate(), "bench-k1")
        k9 = SigningKey.from_private(Ed25519PrivateKey.generate(), "bench-k9")
        decision = SigningKey.from_private(Ed25519PrivateKey.generate())
        return cls(k1, k9, decision, Keyring([TrustedKey(k1.key_id, k1.public_key, False)]))


@dataclass
class Pair:
    """A recipient request with one donor candidate, and what the cohort design expects."""

    cohort: str
    index: int
    base: str  # the realistic cohort the pair was built from (a mutation's allow base)
    recipient: PromptSpec
    donor: PromptSpec
    request: CapturedRequest
    similarity: float
    required: list[str]
    question: str
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def expect(self) -> str:
        return expected(self.cohort)

    @property
    def pair_id(self) -> str:
        return f"{self.cohort}-{self.index}"


def captured_request(
    *,
    request_id: str,
    received_at: datetime,
    tenant: str,
    namespace: str,
    task: Task,
    contract: Json,
    recipient: PromptSpec,
    donor_id: str,
    donor: PromptSpec,
    similarity: float,
    provenance: Json,
    expect: str | None = None,
) -> CapturedRequest:
    """A ``semgov.captured_request/v1`` with one donor candidate (its text included, for the PII scan)."""
    return CapturedRequest.model_validate(
        captured_json(
            request_id=request_id,
            received_at=received_at,
            tenant=tenant,
            namespace=namespace,
            task_id=task.id,
            contract=contract,
            prompt=recipient.wire(),
            candidates=[candidate(donor_id, similarity, donor.wire(), provenance)],
            expect={donor_id: expect} if expect else None,
        )
    )


def signed_provenance(call: Call, donor_id: str, donor: PromptSpec, key: SigningKey, **changes: Any) -> Json:
    """The donor's provenance, signed by ``key`` after applying ``changes`` to the payload."""
    payload = donor_payload(
        donor_id=donor_id,
        tenant=call.entity.tenant,
        namespace=call.entity.namespace,
        task_id=call.task.id,
        contract=call.contract,
        created_at=call.received_at,
        prompt=donor.wire(),
        changes=changes,
    )
    return sign_provenance(payload, key)


class WorkloadBuilder:
    """Builds pairs for every cohort from a few entities per tenant."""

    def __init__(self, tokenize: Tokenize, evidence_tokens: int, keys: BenchKeys, *, seed: int = 7) -> None:
        self.tokenize = tokenize
        self.keys = keys
        self.seed = seed
        self.rng = random.Random(seed)
        # Two companies per tenant: entity swaps stay within a tenant.
        self.entities = [
            make_entity(i, tokenize, evidence_tokens, self.rng, tenant=TENANTS[i % len(TENANTS)])
            for i in range(2 * len(TENANTS))
        ]

    def _sibling(self, e: Entity) -> Entity:
        return next(x for x in self.entities if x.tenant == e.tenant and x is not e)

    def calls(self, cohort: str, k: int, variant: str = "") -> tuple[Call, Call]:
        """(recipient, donor) calls of the realistic cohort ``cohort``, variant ``k``.

        The recipient (company, task, template, question) is drawn per ``(variant or cohort, k)``, so
        cohorts do not all ask the same question.
        """
        rng = random.Random(f"{self.seed}/{variant or cohort}/{k}")
        e = rng.choice(self.entities)
        ti = rng.randrange(2)
        task, other = TASKS[ti], TASKS[1 - ti]
        tpl = rng.randrange(2)
        q = rng.randrange(len(task.questions))
        t0 = START + timedelta(hours=3 * k)
        donor_at, at = t0, t0 + timedelta(minutes=40)
        rec = Call(e, task, tpl, q, at)
        if cohort == "exact":
            return rec, Call(e, task, tpl, q, donor_at)
        if cohort == "shifted":  # the other template of the same contract before the same evidence
            return rec, Call(e, task, 1 - tpl, q, donor_at)
        if cohort == "removed_wrapper":  # no instruction at all before the donor's evidence
            return Call(e, task, -1, q, at), Call(e, task, tpl, q, donor_at)
        if cohort == "question":
            return rec, Call(e, task, tpl, (q + 1 + rng.randrange(len(task.questions) - 1)) % 6, donor_at)
        if cohort == "instruction":  # the template that asks for the contract's next revision
            return rec, Call(e, task, 2, q, donor_at)
        if cohort == "task":
            return rec, Call(e, other, tpl, rng.randrange(len(other.questions)), donor_at)
        if cohort == "entity_swap":
            return rec, Call(self._sibling(e), task, tpl, q, donor_at)
        if cohort == "unrelated":
            return rec, Call(self._sibling(e), other, 1 - tpl, rng.randrange(len(other.questions)), donor_at)
        raise ValueError(f"not a realistic cohort: {cohort}")

    def pair(self, cohort: str, k: int) -> Pair:
        base = cohort if cohort in REALISTIC else ALLOW_BASES[k % len(ALLOW_BASES)]
        rec_call, donor_call = self.calls(base, k, variant=cohort)
        changes: Json = {}
        key = self.keys.k1
        created = donor_call.received_at
        if cohort == "other_tenant":  # provenance names another tenant that uses the same namespace name
            changes = {"tenant": next(t for t in TENANTS if t != donor_call.entity.tenant)}
        elif cohort == "expired":  # a one-hour cache entry, asked for two hours later
            rec_call = Call(
                rec_call.entity,
                rec_call.task,
                rec_call.template,
                rec_call.question,
                created + timedelta(hours=2),
            )
            changes = {"expires_at": rfc3339(created + timedelta(hours=1))}
        elif cohort == "stale_policy":
            changes = {"policy_version": "default@0"}
        elif cohort == "unknown_key":
            key = self.keys.k9
        elif cohort == "pii_text":  # a pasted footer the producer's scan missed
            slug = donor_call.entity.name.split()[0].lower()
            donor_call = Call(
                donor_call.entity,
                donor_call.task,
                donor_call.template,
                donor_call.question,
                donor_call.received_at,
                evidence_extra=f" Investor relations: ir@{slug}.com.",
            )
        recipient = rec_call.prompt(self.tokenize)
        donor = donor_call.prompt(self.tokenize)
        donor_id = f"donor-{cohort}-{k}"
        prov = signed_provenance(donor_call, donor_id, donor, key, **changes)
        if cohort == "tampered":  # edited after signing, in a way no other gate notices
            prov["payload"] = {**prov["payload"], "visibility": "public"}
        lo, hi = REALISTIC[base][1]
        similarity = round(self.rng.uniform(lo, hi), 4)
        e = rec_call.entity
        request = captured_request(
            request_id=f"req-{cohort}-{k}",
            received_at=rec_call.received_at,
            tenant=e.tenant,
            namespace=e.namespace,
            task=rec_call.task,
            contract=rec_call.contract,
            recipient=recipient,
            donor_id=donor_id,
            donor=donor,
            similarity=similarity,
            provenance=prov,
            expect=expected(cohort),
        )
        return Pair(
            cohort=cohort,
            index=k,
            base=base,
            recipient=recipient,
            donor=donor,
            request=request,
            similarity=similarity,
            required=rec_call.required,
            question=rec_call.question_text,
            notes={"entity": e.name, "task": rec_call.task.id, "donor_entity": donor_call.entity.name},
        )

    def pairs(self, per_cohort: int, cohorts: Sequence[str] = COHORTS) -> list[Pair]:
        return [self.pair(c, k) for k in range(per_cohort) for c in cohorts]


@dataclass
class PrefixCase:
    """The prefix-reuse measurement: a long prompt whose donor asked another question about the
    same evidence (common prefix: everything but the question), and its captured request."""

    recipient: PromptSpec
    donor: PromptSpec
    request: CapturedRequest
    required: list[str]


def prefix_case(tokenize: Tokenize, tokens: int, keys: BenchKeys, seed: int = 11) -> PrefixCase:
    """A :class:`PrefixCase` whose recipient prompt has about ``tokens`` tokens."""
    e = make_entity(0, tokenize, evidence_budget(tokenize, tokens), random.Random(seed), tenant="acme")
    rec_call = Call(e, TASKS[0], 0, 0, START + timedelta(minutes=40))
    donor_call = Call(e, TASKS[0], 0, 1, START)
    rec, donor = rec_call.prompt(tokenize), donor_call.prompt(tokenize)
    request = captured_request(
        request_id="req-prefix",
        received_at=rec_call.received_at,
        tenant=e.tenant,
        namespace=e.namespace,
        task=rec_call.task,
        contract=rec_call.contract,
        recipient=rec,
        donor_id="donor-prefix",
        donor=donor,
        similarity=0.85,
        provenance=signed_provenance(donor_call, "donor-prefix", donor, keys.k1),
        expect="allow",
    )
    return PrefixCase(rec, donor, request, rec_call.required)


def evidence_budget(tokenize: Tokenize, prompt_tokens: int) -> int:
    """Evidence tokens that make a prompt of about ``prompt_tokens`` tokens."""
    probe = make_entity(0, tokenize, 64, random.Random(0), tenant="acme")
    longest_question = max(
        (Call(probe, t, tpl, q, START) for t in TASKS for tpl in range(3) for q in range(len(t.questions))),
        key=lambda c: len(c.prompt(tokenize).token_ids),
    )
    overhead = len(longest_question.prompt(tokenize).token_ids) - len(tokenize(probe.evidence))
    return max(64, prompt_tokens - overhead)
