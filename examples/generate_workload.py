"""Generate a deterministic, realistic captured-traffic workload for ``semgov check``.

The workload imitates a financial-research assistant serving three tenants.
Every entity (a company) has its own namespace ``research/entity-NNN`` and an
evidence file of synthetic but realistic figures; analysts call two tasks on it
(``extract_financials@1``, ``summarize_risks@1``) with a few instruction
templates and questions, in time order from 2026-11-20T08:00:00Z over five days.
Each call's donor candidates are earlier calls, as a semantic cache would
propose them, in these cohorts (the expected decision follows from the design,
it is not computed by semgov):

- realistic: ``exact`` repeat (allow), ``shifted`` repeat (other instruction
  template before the same evidence and question; deny: safe, but the default
  policy turns shifted spans off for answer quality until a rule turns them on),
  ``question`` variant (allow through the common prefix), ``instruction``
  variant with a new response contract
  (deny), changed ``task`` (deny), ``entity_swap`` from another namespace of the
  same tenant (deny), ``unrelated`` (deny);
- single-gate mutations of an allow pair (deny): ``other_tenant`` (provenance
  names another tenant with the same namespace), ``expired`` (a one-hour entry
  that has lapsed, or one restored from a capture older than the policy's 30-day
  max age), ``stale_policy`` (``default@0``), ``tampered`` (payload edited after
  signing), ``unknown_key`` (signed by a key outside the keyring),
  ``revoked_key``, ``pii_declared`` (provenance lists PII) and ``pii_text`` (the
  donor text holds an email address or phone number the provenance does not
  declare; semgov's own scan must find it).

Donor ids are the donor's request id; a mutated candidate keeps the id of the
request it was derived from. The cohort is not on the wire: the generator
prints a count per cohort.

Token ids are SYNTHETIC. No real tokenizer is a dependency yet, so
:func:`tokenize` is a word-level toy: a regex splits text into words and
punctuation, and each piece maps to the first 4 bytes of its SHA-256 modulo
49152 (SmolLM2's vocabulary size). Each segment is tokenized on its own and
segment texts are concatenated, so token ranges line up with segments. A real
tokenizer plugs in by replacing :func:`tokenize`.

Usage: ``python examples/generate_workload.py [--out PATH] [--entities N]
[--calls N] [--seed S] [--evidence-tokens N] [--make-keys]``; the output is
gzip-compressed when PATH ends with ``.gz``, and byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import semgov
from engine_hooks.reference.workload import (
    ALLOW_BASES,
    REALISTIC_DESIGN,
    START,
    TENANTS,
    TTL,
    VOCAB_SIZE,
    Entity,
    Json,
    Task,
    candidate,
    captured_json,
    contract_ref,
    donor_payload,
    entity_namespace,
    expected,
    musd,
    question_text,
    rfc3339,
    segment_tokens,
    ticker,
)
from semgov.signing.keys import SigningKey, public_pem

EXAMPLES = Path(__file__).resolve().parent
KEYS_DIR = EXAMPLES / "keys"
KEYRING = EXAMPLES / "keyring.json"
WINDOW_S = 5 * 86400  # all calls fall in five days, within the 7-day provenance TTL
RECENT_PER_TENANT = 300  # cross-entity neighbours come from this many recent calls

# --- tokenizer ---------------------------------------------------------------

_PIECE = re.compile(r"\w+|[^\w\s]")


@cache
def _piece_id(piece: str) -> int:
    return int.from_bytes(hashlib.sha256(piece.encode("utf-8")).digest()[:4], "big") % VOCAB_SIZE


def tokenize(text: str) -> list[int]:
    """Synthetic word-level token ids; the one function a real tokenizer replaces."""
    return [_piece_id(p) for p in _PIECE.findall(text)]


# --- content -----------------------------------------------------------------

SYSTEM = {
    "acme": "You are the Acme Capital research assistant. Answer only from the evidence provided "
    "and cite figures exactly as written.",
    "globex": "You are the Globex Advisors research copilot. Be precise, never invent numbers, and flag "
    "any figure missing from the evidence.",
    "initech": "You are the Initech Wealth analyst assistant. Use only the supplied documents, keep "
    "units as written, and answer in a neutral tone.",
}

# Contract schemas by (id, revision); instruction template 2 of each task asks for revision 2.
SCHEMAS = {
    ("financials", 1): '{"type":"object","required":["revenue_musd","revenue_growth_pct","gross_margin_pct",'
    '"operating_margin_pct","net_income_musd","eps_usd","cash_musd","debt_musd","headcount"]}',
    ("financials", 2): '{"type":"array","items":{"type":"object","required":["metric","value","unit",'
    '"currency","fiscal_period"]}}',
    ("risk_summary", 1): '{"type":"object","required":["risks"],"properties":{"risks":{"type":"array",'
    '"items":{"required":["category","severity","quote"]}}}}',
    ("risk_summary", 2): '{"type":"object","required":["register"],"properties":{"register":{"type":"array",'
    '"items":{"required":["risk","likelihood","impact","horizon","mitigation","quote"]}}}}',
}


TASKS = (
    Task(
        "extract_financials",
        "financials",
        (
            "Extract the key financial figures for the company described in the evidence. Return JSON "
            "that matches the financials schema: revenue, growth, margins, net income, EPS, cash, debt "
            "and headcount. Use null for any figure that is not stated.",
            "Read the research file below and fill in the financials record. Copy numbers exactly as "
            "written, keep units in millions of US dollars, and do not estimate values the evidence "
            "does not give.",
            "Extract the financial figures into the financials v2 record, which adds the fiscal period "
            "and reporting currency to every value. Return one JSON object per reported metric, with "
            "null where the evidence is silent.",
        ),
        (
            "What were {name}'s revenue and operating margin in the third quarter of fiscal 2026, and "
            "how did they change from a year earlier?",
            "How much free cash flow did {name} generate in the first nine months, and how much did it "
            "spend on share repurchases?",
            "What is {name}'s full-year revenue guidance, and how does it compare with results so far?",
            "Break down {name}'s quarterly revenue by segment and give the growth rate of the largest "
            "segment.",
            "What were {name}'s cash, total debt and net leverage at the end of the quarter?",
            "How many employees does {name} have, and how did headcount change over the year?",
        ),
    ),
    Task(
        "summarize_risks",
        "risk_summary",
        (
            "Summarize the material risks for the company described in the evidence. Return JSON that "
            "matches the risk summary schema: a list of risks, each with a category, a severity from 1 "
            "to 5 and a supporting quote.",
            "Act as a credit analyst and list the risks an investor should watch, using only the evidence "
            "below. Rate each risk from 1 to 5, name its category, and quote the sentence that supports it.",
            "Produce a risk register for the company in the evidence, following the risk summary v2 "
            "schema with likelihood, impact, time horizon and mitigation for each risk, and cite the "
            "supporting sentence.",
        ),
        (
            "What are the three most serious risks to {name}'s earnings over the next twelve months?",
            "Is {name} exposed to customer concentration or currency risk, and how large is each exposure?",
            "Which balance sheet risks could limit {name}'s flexibility, including debt maturities and "
            "covenants?",
            "What operational risks does the evidence mention for {name}, and which segment do they affect?",
            "Summarize the regulatory and legal risks that {name} has disclosed, and say whether any "
            "penalty has been estimated.",
            "How could {name} miss its full-year guidance, according to the evidence?",
        ),
    ),
)
TEMPLATE_WEIGHTS = (50, 30, 20)
QUESTION_WEIGHTS = (30, 20, 15, 15, 10, 10)

# sector: (segments, capex use, inventory reason, sector risk)
SECTORS = {
    "industrial automation": (
        ("Motion Control", "Process Automation", "Aftermarket Services"),
        "a new drives plant",
        "longer lead times for power electronics",
        "Orders from automotive customers fell {x:.1f}% as two large programs were delayed.",
    ),
    "enterprise software": (
        ("Cloud Platform", "Subscription Licenses", "Professional Services"),
        "data center capacity",
        "prepaid hardware for a hosting migration",
        "Net revenue retention slowed to {r}% as customers consolidated seats.",
    ),
    "specialty pharmaceuticals": (
        ("Branded Products", "Generics", "Contract Manufacturing"),
        "a sterile fill line",
        "a build ahead of a product launch",
        "Patent protection for the lead product, which provides {x:.1f}% of revenue, expires in {y}.",
    ),
    "consumer goods": (
        ("Home Care", "Personal Care", "Pet Nutrition"),
        "packaging automation",
        "slower sell-through at two large retailers",
        "Retailer destocking cut shipments by {x:.1f}% in the quarter, mostly in North America.",
    ),
    "freight logistics": (
        ("Truckload", "Intermodal", "Brokerage"),
        "tractor replacement",
        "spare parts for the aging fleet",
        "Contract rates fell {x:.1f}% year over year while driver wages kept rising.",
    ),
    "renewable energy": (
        ("Solar Development", "Storage Systems", "Operations and Maintenance"),
        "battery module assembly",
        "panels held for delayed interconnections",
        "Interconnection delays pushed {x:.1f}% of the project pipeline into fiscal {y}.",
    ),
    "semiconductors": (
        ("Analog", "Power Management", "Sensors"),
        "a wafer capacity expansion",
        "a weaker industrial market",
        "Utilization at the main fab dropped to {r}%, which weighs on gross margin.",
    ),
}
PREFIXES = (
    "Aster Borealis Cobalt Dunmore Everline Fairwind Granite Halcyon Ironwood Juniper Keystone Larkspur "
    "Meridian Northgate Oakridge Pinnacle Quarry Redfern Silverton Tidewater Upland Vantage Westmark "
    "Yellowstone Zephyr Alderon Brightwater Cedarline Driftwood Emberly"
).split()
SUFFIXES = ("Holdings", "Industries", "Systems", "Group", "Technologies", "Brands", "Partners", "Corporation")
CITIES = ("Columbus", "Denver", "Raleigh", "Minneapolis", "Austin", "Pittsburgh", "Charlotte", "Hartford")
MONTHS = ("October", "November")


def _evidence(name: str, ticker: str, sector: str, rng: random.Random, target: int) -> str:
    """A research file for one company: figures first, then risks, about ``target`` tokens."""
    segs, capex_use, inv_reason, sector_risk = SECTORS[sector]
    u = rng.uniform
    rev, growth, gm = u(180, 6500), u(-6, 24), u(22, 71)
    om = u(4, min(gm - 6, 34))
    ni, shares = rev * om / 100 * u(0.55, 0.8), u(40, 420)
    head = rng.randrange(900, 48000, 50)
    split = sorted(rng.sample(range(20, 80), 2))
    parts = [split[0], split[1] - split[0], 100 - split[1]]
    cash, debt = rev * u(0.1, 0.6), rev * u(0.2, 1.4)
    lo = rev * 4 * u(0.97, 1.03)
    up_down = ("up", "down")
    head_sentences = [
        f"{name} ({ticker}) research file. Sources: results for the third quarter of fiscal 2026, "
        f"released {rng.choice(MONTHS)} {rng.randint(2, 12)}, 2026, and the annual report for fiscal 2025.",
        f"{name} is a {sector} company based in {rng.choice(CITIES)} with {head:,} employees at quarter "
        f"end, up from {int(head / u(0.9, 1.12)):,} a year earlier.",
        f"Revenue for the quarter ended September 30, 2026 was {musd(rev)}, "
        f"{up_down[growth < 0]} {abs(growth):.1f}% from {musd(rev / (1 + growth / 100))} a year earlier.",
    ]
    body = [
        f"Gross margin was {gm:.1f}%, {rng.choice(up_down)} {rng.randint(20, 240)} basis points, as "
        f"{rng.choice(('pricing offset input costs', 'mix shifted to services', 'freight costs eased'))}.",
        f"Operating income was {musd(rev * om / 100)}, an operating margin of {om:.1f}% compared with "
        f"{om + u(-3, 3):.1f}% a year ago.",
        f"Net income was {musd(ni)}, or ${ni / shares:.2f} per diluted share, on {shares:.1f} million "
        "diluted shares.",
        f"The {segs[0]} segment contributed {musd(rev * parts[0] / 100)}, {parts[0]}% of revenue, and "
        f"grew {u(-4, 30):.1f}%, while {segs[1]} brought in {musd(rev * parts[1] / 100)} and {segs[2]} "
        f"{musd(rev * parts[2] / 100)}.",
        f"Cash and equivalents were {musd(cash)} against total debt of {musd(debt)}, and net leverage "
        f"stood at {u(0.2, 3.8):.1f} times trailing EBITDA.",
        f"Free cash flow for the first nine months was {musd(rev * u(0.1, 0.5))}, and the company "
        f"repurchased {shares * u(0.005, 0.03):.1f} million shares for {musd(rev * u(0.02, 0.12))}.",
        f"Capital expenditure was {musd(rev * u(0.02, 0.09))} in the quarter, mostly for {capex_use}.",
        f"Management {rng.choice(('raised', 'reaffirmed', 'lowered'))} full-year revenue guidance at "
        f"{musd(lo, 0)} to {musd(lo * u(1.02, 1.05), 0)} and expects an operating margin of about "
        f"{om + u(-1.5, 1.5):.1f}%.",
        f"Order backlog was {musd(rev * u(0.6, 2.5), 0)}, {rng.choice(up_down)} {u(0.5, 9):.1f}% from "
        "the prior quarter.",
        f"The largest customer accounted for {rng.randrange(4, 23)}% of revenue and the ten largest for "
        f"{rng.randrange(25, 61)}%.",
        f"About {rng.randrange(12, 61)}% of sales are invoiced in currencies other than the US dollar, so "
        "a stronger dollar would weigh on reported growth.",
        f"Notes of {musd(debt * u(0.2, 0.6), 0)} mature in {rng.randint(2027, 2030)}, and the credit "
        f"facility requires net leverage below {u(3.5, 4.5):.1f} times.",
        f"Inventory rose to {musd(rev * u(0.1, 0.4))}, or {rng.randint(45, 160)} days of supply, which "
        f"management attributed to {inv_reason}.",
        sector_risk.format(x=u(3, 28), r=rng.randint(72, 118), y=rng.randint(2027, 2031)),
        "The company disclosed an open regulatory inquiry in "
        f"{rng.choice(('the European Union', 'Brazil', 'India', 'California'))} and has not estimated "
        "a potential penalty.",
        f"Employee attrition ran at {u(6, 19):.1f}% annualized, and the company plans to add about "
        f"{rng.randrange(50, 900, 10)} roles in {rng.choice(segs)} next year.",
    ]
    order = list(range(len(body)))
    rng.shuffle(order)
    n = sum(len(tokenize(s)) for s in head_sentences)
    keep: list[int] = []
    for i in order:
        if n >= target:
            break
        keep.append(i)
        n += len(tokenize(body[i]))
    return " ".join(head_sentences + [body[i] for i in sorted(keep)])


def make_entities(n: int, rng: random.Random, evidence_tokens: int) -> list[Entity]:
    names = [f"{p} {s}" for p in PREFIXES for s in SUFFIXES]
    rng.shuffle(names)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        target = round(evidence_tokens * rng.uniform(0.72, 1.2))
        sector = rng.choice(sorted(SECTORS))
        evidence = _evidence(name, ticker(name), sector, rng, target)
        out.append(Entity(i, TENANTS[i % len(TENANTS)], entity_namespace(i), name, evidence))
    return out


# --- calls and prompts ---------------------------------------------------------


def build_prompt(parts: list[tuple[str, str]]) -> Json:
    """Tokenize each segment on its own; a separator ends every segment text but the last."""
    last = len(parts) - 1
    texts = [(role, text if i == last else text + "\n\n") for i, (role, text) in enumerate(parts)]
    ids, segments = segment_tokens((role, tokenize(text)) for role, text in texts)
    return {"token_ids": ids, "text": "".join(text for _, text in texts), "segments": segments}


@dataclass(frozen=True)
class Call:
    request_id: str
    received_at: datetime
    entity: Entity
    task: Task
    template: int
    question: int

    @property
    def contract(self) -> Json:
        return contract_ref(SCHEMAS, self.task, self.template)

    def parts(self, evidence_extra: str = "") -> list[tuple[str, str]]:
        e = self.entity
        return [
            ("system", SYSTEM[e.tenant]),
            ("instruction", self.task.templates[self.template]),
            ("evidence", e.evidence + evidence_extra),
            ("question", question_text(self.task, self.question, e.name)),
        ]

    @property
    def prompt(self) -> Json:
        return build_prompt(self.parts())


def plan_calls(entities: list[Entity], calls: int, rng: random.Random) -> list[Call]:
    """Calls of all entities in one time line.

    An analyst often repeats an earlier call on the same company, or re-asks its
    question through the other instruction template of the same contract.
    """
    total = len(entities) * calls
    if total > WINDOW_S:
        raise SystemExit(f"at most {WINDOW_S} calls fit in the time window")
    times = sorted(rng.sample(range(WINDOW_S), total))
    owners = [e for e in entities for _ in range(calls)]
    rng.shuffle(owners)
    seen: dict[int, list[tuple[Task, int, int]]] = {}
    out = []
    for n, (t, e) in enumerate(zip(times, owners, strict=True)):
        past = seen.setdefault(e.index, [])
        r = rng.random()
        if past and r < 0.45:
            task, template, question = rng.choice(past)
            if r < 0.15:
                template = {0: 1, 1: 0}.get(template, template)
        else:
            task = rng.choices(TASKS, weights=(60, 40))[0]
            template = rng.choices(range(3), weights=TEMPLATE_WEIGHTS)[0]
            question = rng.choices(range(len(task.questions)), weights=QUESTION_WEIGHTS)[0]
        past.append((task, template, question))
        out.append(Call(f"req-{n + 1:06d}", START + timedelta(seconds=t), e, task, template, question))
    return out


# --- provenance and candidates ---------------------------------------------------


@dataclass(frozen=True)
class Keys:
    k1: SigningKey
    k2_revoked: SigningKey
    rogue: SigningKey


def payload(donor: Call, prompt: Json, **changes: Any) -> Json:
    return donor_payload(
        donor_id=donor.request_id,
        tenant=donor.entity.tenant,
        namespace=donor.entity.namespace,
        task_id=donor.task.id,
        contract=donor.contract,
        created_at=donor.received_at,
        prompt=prompt,
        changes=changes,
    )


def sign(p: Json, key: SigningKey) -> Json:
    return semgov.sign_provenance(p, key)


WEIGHTS = {  # how often each realistic cohort is drawn, relative to the others
    "exact": 30,
    "question": 22,
    "shifted": 20,
    "instruction": 7,
    "task": 7,
    "entity_swap": 3,
    "unrelated": 3,
}
# cohort: (expected decision, similarity range, weight)
REALISTIC = {c: (*REALISTIC_DESIGN[c], w) for c, w in WEIGHTS.items()}
MUTATIONS = tuple(
    "other_tenant expired stale_policy tampered unknown_key revoked_key pii_declared pii_text".split()
)
MUTATION_WEIGHT = 2.5  # per mutation cohort
COHORTS = (*REALISTIC, *MUTATIONS)


def mutated(kind: str, recipient: Call, donor: Call, keys: Keys, rng: random.Random) -> tuple[Json, Json]:
    """Donor prompt and provenance that break exactly one gate of an allow pair."""
    prompt = donor.prompt
    key = keys.k1
    changes: Json = {}
    if kind == "other_tenant":  # another tenant that happens to use the same namespace name
        other = rng.choice(sorted(set(SYSTEM) - {donor.entity.tenant}))
        changes = {"tenant": other, "visibility": rng.choice(("tenant", "public"))}
    elif kind == "expired":
        if recipient.received_at - donor.received_at > timedelta(hours=1):  # a one-hour entry, lapsed
            changes = {"expires_at": rfc3339(donor.received_at + timedelta(hours=1))}
        else:  # restored from an older capture: valid, but past the policy's 30-day max age
            created = recipient.received_at - timedelta(days=rng.randint(31, 45))
            changes = {"created_at": rfc3339(created), "expires_at": rfc3339(created + timedelta(days=90))}
    elif kind == "stale_policy":
        changes = {"policy_version": "default@0"}
    elif kind == "unknown_key":
        key = keys.rogue
    elif kind == "revoked_key":
        key = keys.k2_revoked
    elif kind == "pii_declared":
        changes = {"pii": {"scanned": True, "entities": [rng.choice(("EMAIL_ADDRESS", "PHONE_NUMBER"))]}}
    elif kind == "pii_text":  # the analyst pasted the press release footer; the producer's scan missed it
        slug = donor.entity.name.split()[0].lower()
        footer = rng.choice(
            (
                f" Investor relations: ir@{slug}.com.",
                f" Investor relations: +1 212-555-01{rng.randrange(100):02d}.",
            )
        )
        prompt = build_prompt(donor.parts(evidence_extra=footer))
    prov = sign(payload(donor, prompt, **changes), key)
    if kind == "tampered":  # edited after signing, in a way no other gate notices
        field, value = rng.choice(
            (("visibility", "public"), ("expires_at", rfc3339(donor.received_at + TTL + timedelta(days=21))))
        )
        prov["payload"] = {**prov["payload"], field: value}
    return prompt, prov


def pools(call: Call, mine: list[Call], recent: deque[Call]) -> dict[str, list[Call]]:
    """Earlier calls by the cohort they would form as donors for ``call``."""
    out: dict[str, list[Call]] = {c: [] for c in REALISTIC}
    for d in mine:  # another template and another question: not a near neighbour, left out
        if d.task is not call.task:
            out["task"].append(d)
        elif d.contract != call.contract:
            out["instruction"].append(d)
        elif d.template == call.template:
            out["exact" if d.question == call.question else "question"].append(d)
        elif d.question == call.question:
            out["shifted"].append(d)
    others = [d for d in recent if d.entity is not call.entity]
    key = (call.task, call.template, call.question)
    out["entity_swap"] = [d for d in others if (d.task, d.template, d.question) == key] or [
        d for d in others if d.task is call.task
    ]
    out["unrelated"] = [d for d in others if d.task is not call.task]
    return out


def candidates(
    call: Call, mine: list[Call], recent: deque[Call], keys: Keys, rng: random.Random, counts: Counter[str]
) -> tuple[list[Json], dict[str, str]]:
    by_cohort = pools(call, mine, recent)
    allow_pairs = [(base, d) for base in ALLOW_BASES for d in by_cohort[base]]
    weights: dict[str, float] = {c: w for c, (_, _, w) in REALISTIC.items() if by_cohort[c]}
    if allow_pairs:
        weights.update({m: MUTATION_WEIGHT for m in MUTATIONS})
    cands: list[Json] = []
    expect: dict[str, str] = {}
    for _ in range(rng.choices((1, 2, 3), weights=(35, 40, 25))[0]):
        if not weights:
            break
        cohort = rng.choices(list(weights), weights=list(weights.values()))[0]
        del weights[cohort]
        if cohort in REALISTIC:
            options = [(cohort, d) for d in by_cohort[cohort] if d.request_id not in expect]
        else:
            options = [(b, d) for b, d in allow_pairs if d.request_id not in expect]
        if not options:
            continue
        base, donor = rng.choice(options)
        lo, hi = REALISTIC[base][1]
        if cohort in REALISTIC:
            prompt = donor.prompt
            prov = sign(payload(donor, prompt), keys.k1)
            expect[donor.request_id] = REALISTIC[cohort][0]
        else:
            prompt, prov = mutated(cohort, call, donor, keys, rng)
            expect[donor.request_id] = "deny"
        cands.append(candidate(donor.request_id, round(rng.uniform(lo, hi), 4), prompt, prov))
        counts[cohort] += 1
    return cands, expect


def generate(
    entities: int, calls: int, seed: int, evidence_tokens: int, keys: Keys, counts: Counter[str]
) -> Iterator[Json]:
    """Captured requests in time order; ``counts`` tallies candidates by cohort."""
    rng = random.Random(seed)
    history: dict[int, list[Call]] = {}
    recent: dict[str, deque[Call]] = {t: deque(maxlen=RECENT_PER_TENANT) for t in SYSTEM}
    for call in plan_calls(make_entities(entities, rng, evidence_tokens), calls, rng):
        e = call.entity
        mine = history.setdefault(e.index, [])
        cands, expect = candidates(call, mine, recent[e.tenant], keys, rng, counts)
        yield captured_json(
            request_id=call.request_id,
            received_at=call.received_at,
            tenant=e.tenant,
            namespace=e.namespace,
            task_id=call.task.id,
            contract=call.contract,
            prompt=call.prompt,
            candidates=cands,
            expect=expect,
        )
        mine.append(call)
        recent[e.tenant].append(call)


# --- keys ------------------------------------------------------------------------

KEY_FILES = {
    "k1": "provenance-k1.pem",
    "k2": "provenance-k2-revoked.pem",
    "k9": "provenance-rogue.pem",
    "decision": "decision-signing-key.pem",
}


def _write_private(path: Path, key: Ed25519PrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)


def make_keys() -> None:
    """Create the demo keys that are missing, then (re)write the keyring: k1 trusted, k2 revoked."""
    KEYS_DIR.mkdir(parents=True, exist_ok=True)
    for name in KEY_FILES.values():
        path = KEYS_DIR / name
        if not path.exists():
            key = Ed25519PrivateKey.generate()
            _write_private(path, key)
            if name == KEY_FILES["decision"]:
                path.with_suffix(".pub.pem").write_text(public_pem(key.public_key()), encoding="ascii")
    entries = []
    for kid in ("k1", "k2"):
        public = semgov.load_signing_key(KEYS_DIR / KEY_FILES[kid]).public_key
        entries.append({"key_id": kid, "public_key": public_pem(public), "revoked": kid == "k2"})
    ring = {"keys": entries}
    KEYRING.write_text(json.dumps(ring, indent=2) + "\n", encoding="ascii")


def load_keys() -> Keys:
    def key(kid: str) -> SigningKey:
        path = KEYS_DIR / KEY_FILES[kid]
        if not path.exists():
            raise SystemExit(f"{path} is missing; run with --make-keys to create the demo keys")
        return SigningKey.from_private(semgov.load_signing_key(path).private_key, key_id=kid)

    return Keys(key("k1"), key("k2"), key("k9"))


# --- main ------------------------------------------------------------------------


def write(records: Iterable[Json], out: Path) -> int:
    """Write JSON Lines, gzip with a fixed header when ``out`` ends with .gz; return the line count."""
    n = 0
    with open(out, "wb") as raw:
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if out.suffix == ".gz" else None
        with gz or nullcontext():
            for r in records:
                (gz or raw).write(json.dumps(r, separators=(",", ":")).encode("utf-8") + b"\n")
                n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=EXAMPLES / "captured.jsonl.gz",
        help="output JSON Lines, gzip if it ends with .gz (default: examples/captured.jsonl.gz)",
    )
    ap.add_argument("--entities", type=int, default=105, help="companies over 3 tenants (default 105)")
    ap.add_argument("--calls", type=int, default=20, help="calls per company (default 20)")
    ap.add_argument("--seed", type=int, default=7, help="random seed (default 7)")
    ap.add_argument(
        "--evidence-tokens",
        type=int,
        default=350,
        help="mean evidence tokens, -28%%..+20%% per company (default 350, min 200)",
    )
    ap.add_argument(
        "--make-keys",
        action="store_true",
        help="create missing demo keys in examples/keys and rewrite examples/keyring.json",
    )
    args = ap.parse_args(argv)
    if args.evidence_tokens < 200:
        # The allow cohorts rely on the evidence being most of the prompt (>= 50%, >= 64 tokens).
        ap.error("--evidence-tokens must be at least 200")
    if args.entities < 1 or args.calls < 1:
        ap.error("--entities and --calls must be positive")
    if args.make_keys:
        make_keys()
    t0 = time.perf_counter()
    counts: Counter[str] = Counter()
    records = generate(args.entities, args.calls, args.seed, args.evidence_tokens, load_keys(), counts)
    requests = write(records, args.out)
    elapsed = time.perf_counter() - t0
    total = sum(counts.values())
    print(f"{'cohort':<14}{'expect':>7}{'count':>8}{'share':>8}")
    for c in COHORTS:
        print(f"{c:<14}{expected(c):>7}{counts[c]:>8}{counts[c] / max(total, 1):>8.1%}")
    print(f"{'total':<14}{'':>7}{total:>8}")
    print(
        f"{requests} requests, {total} candidates -> {args.out} "
        f"({args.out.stat().st_size / 1e6:.2f} MB) in {elapsed:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
