"""Does governed reuse keep the answer inside a real server? Paired runs with real weights.

Usage: ``python benchmarks/server_quality.py --engine sglang|vllm --model qwen2.5-coder-0.5b
[--pairs 30] [--deny-pairs 2] [--tokens 2000] [--out DIR]``

One real server (SGLang 0.5.23 with ``--radix-cache-backend semgov``, or vLLM 0.32 with semgov's
scope middleware and connector) serves the model with its real weights (converted once from the
registry GGUF: :func:`engine_hooks.reference.model.server_dir`) and its tokenizer, and semgov's
shipped default policy (``policies/rego/default``, the PII scan on real donor text: the hook's
``auto`` detokenizer) with the real MinHash candidate provider. Prompts are the ``semgov bench``
workload (:mod:`engine_hooks.reference.bench_workload`: research files whose figures the
questions ask for, the model's chat template, segments from the tokenizer's offsets), sent as
token ids with a context token a gateway would mint (tenant, namespace, task, response contract,
segments). Greedy, up to ``--max-new-tokens``, stopping at the end of turn.

Per pair, in one namespace of its own:

1. **cold**: the recipient with no context and a cache key of its own (nothing to reuse); the
   first ``--floor-pairs`` pairs run it twice (the cold/cold floor);
2. per arm, in a namespace of its own (a recipient that was not realized enters the prefix cache
   like any request, and would hand a later arm of the same prompt an exact hit): the **donor**
   (its context), then, once the hook registered it (SGLang; vLLM's connector waits for a donor
   still registering within its decision deadline), the recipient with its context:
   - **governed**: decided by the default policy, realized as the signed plan says;
   - **similarity-only** (``--arms``): the policy swapped first (hot reload, audited, waited for)
     for one that approves every token-identical span of a candidate whose similarity is at least
     0.6 and realizes it without recompute (``benchmarks/policies/similarity_only``);
   - **exact-prefix only** (``--arms``): a context without segments (nothing shifted can be
     approved): the engine's own exact-prefix hit on the donor, as stock caching does.

Reuse is counted only from the audit log's ``realization`` events for that request. Answers are
scored for the required value the question asks for (stated by cold and not by the arm: a changed
required value) and compared token for token (a changed answer; wording only when no value
changed). Cohorts: ``shifted`` (a new instruction wrapper), ``removed_wrapper``, ``exact``,
``question``, ``instruction`` (the template of the next contract revision: denied),
``entity_swap`` and ``unrelated`` (another entity's namespace: never a candidate) and
``other_tenant`` (the new-wrapper recipient under another tenant: never a candidate). Prints per
cohort and arm: n, realized pairs and tokens, changed answers and changed required values with 95%
Wilson intervals, prefill tokens avoided per correct answer and TTFT arm/cold (median of the
pair's own ratios: its own baseline in the same run); writes ``OUT/pairs.jsonl`` (as it goes,
``--resume`` continues) and ``OUT/summary.json``. Exit 1 when an invariant broke (a realization for
a cohort that must not reuse, a server error, an audit log that does not verify).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from semgov.stats import wilson  # noqa: E402

POLICIES = ROOT / "benchmarks" / "policies"
GOVERNED_POLICY = ROOT / "policies" / "rego" / "default" / "policy.rego"
SIMILARITY_POLICY = POLICIES / "similarity_only" / "policy.rego"
ALLOW_COHORTS = ("shifted", "removed_wrapper", "exact", "question")
DENY_COHORTS = ("instruction", "entity_swap", "unrelated", "other_tenant")
NEVER_CANDIDATES = ("entity_swap", "unrelated", "other_tenant")


@dataclass
class Sent:
    """One request as the client saw it."""

    ok: bool
    ttft_ms: float | None
    output_ids: list[int]
    error: str | None = None


@dataclass
class Arm:
    name: str
    sent: Sent
    label: str  # the request's id in the audit log
    realized: int = 0
    decisions: list[dict[str, Any]] = field(default_factory=list)


# ---- the engines ----------------------------------------------------------------------------


class SglangEngine:
    """A real SGLang server with the semgov backend (the rig of ``tests/sglang_server``)."""

    name = "sglang"

    def __init__(self, model_dir: Path, work: Path, policy_dir: Path, args: argparse.Namespace) -> None:
        from tests.sglang_server.rig import HookFiles, Server, ServerConfig, free_port

        cfg = ServerConfig(
            model=model_dir,
            dummy_weights=False,
            dtype=args.dtype,
            page_size=1,
            chunked_prefill_size=1024,
            max_total_tokens=65536,
            hook_env=_hook_env(args),
        )
        self.server = Server(cfg, work, HookFiles.make(work / "hook", policy=policy_dir), free_port())
        self.files = self.server.files

    @contextmanager
    def running(self) -> Iterator[SglangEngine]:
        self.server.start()
        try:
            yield self
        finally:
            self.server.stop()

    def send(self, ids: list[int], rid: str, ctx: str | None, anon: str, max_new: int) -> Sent:
        r = self.server.generate(
            ids, rid=rid, extra_key=ctx if ctx is not None else anon, max_new_tokens=max_new, ignore_eos=False
        )
        return Sent(r.ok, r.ttft_ms, list(r.output_ids), r.error)

    def settle(self) -> None:
        from tests.sglang_server.rig import settle

        settle(self.server)

    def label(self, rid: str, audit: Any) -> str:
        return rid

    def alive(self) -> bool:
        return self.server.alive() and not self.server.fatal_lines()

    def tail(self) -> str:
        return self.server.tail()


class VllmEngine:
    """A real vLLM server with semgov's scope middleware and connector (the rig of ``tests/vllm``)."""

    name = "vllm"

    def __init__(self, model_dir: Path, work: Path, policy_dir: Path, args: argparse.Namespace) -> None:
        from tests.sglang_server.rig import HookFiles, free_port
        from tests.vllm.rig import VllmServer, VllmServerConfig, vllm_python

        py = vllm_python()
        if py is None:
            raise SystemExit("no vLLM environment (.venv-vllm or SEMGOV_VLLM_PYTHON; docs/vllm.md)")
        self.python = py
        env = {**_hook_env(args), "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}
        cfg = VllmServerConfig(
            model=model_dir, dummy_weights=False, connector=True, kv_cache_gib="3", hook_env=env,
            dtype=args.dtype, max_model_len=4096,
        )  # fmt: skip
        self.server = VllmServer(cfg, work, HookFiles.make(work / "hook", policy=policy_dir), free_port())
        self.files = self.server.files

    @contextmanager
    def running(self) -> Iterator[VllmEngine]:
        self.server.start(self.python)
        try:
            yield self
        finally:
            self.server.stop()

    def send(self, ids: list[int], rid: str, ctx: str | None, anon: str, max_new: int) -> Sent:
        r = self.server.complete(
            ids, rid, ctx, max_tokens=max_new, cache_salt=None if ctx is not None else anon
        )
        return Sent(r.status == 200 and r.ttft_ms is not None, r.ttft_ms, list(r.tokens), r.error)

    def settle(self) -> None:
        time.sleep(0.2)  # NOTE: the connector waits for a donor still registering (its decision deadline)

    def label(self, rid: str, audit: Any) -> str:
        from tests.vllm.rig import by_client_id

        return by_client_id(audit, rid) or rid

    def alive(self) -> bool:
        return self.server.alive() and not self.server.fatal_lines()

    def tail(self) -> str:
        return self.server.tail()


def _hook_env(args: argparse.Namespace) -> dict[str, str]:
    """The product's settings, as an operator would run them, but for the rig's test plugin."""
    return {
        "SEMGOV_PROVIDER": "minhash",
        "SEMGOV_DETOKENIZER": "auto",
        "SEMGOV_DECISION_TIMEOUT_MS": str(args.decision_timeout_ms),
        "SEMGOV_AUDIT_WAIT_MS": str(args.audit_wait_ms),
        "SEMGOV_RELOAD_POLL_MS": "200",
    }


# ---- policy swaps ---------------------------------------------------------------------------


class PolicySlot:
    """The server's policy directory; :meth:`use` swaps its ``policy.rego`` atomically and waits
    for the hook's ``policy_loaded`` event naming the new revision."""

    def __init__(self, directory: Path, governed: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.governed = governed
        self.current: Path | None = None

    def put(self, source: Path) -> None:
        tmp = self.dir / ".policy.rego.tmp"
        shutil.copyfile(source, tmp)
        os.replace(tmp, self.dir / "policy.rego")
        self.current = source

    def use(self, source: Path, audit_dir: Path, timeout: float = 60.0) -> None:
        import re

        from tests.sglang_server.rig import read_audit, summarize

        if self.current == source:
            return
        name = re.search(r'metadata := \{"name": "([^"]+)", "version": "([^"]+)"\}', source.read_text())
        assert name is not None, f"{source}: no metadata line"
        want = f"live policy {name.group(1)}@{name.group(2)} "
        seen = len(summarize(read_audit(audit_dir, wait_s=0)).reloads)
        self.put(source)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            loaded = summarize(read_audit(audit_dir, wait_s=0)).reloads[seen:]
            if any(r["kind"] == "policy_loaded" and str(r.get("detail")).startswith(want) for r in loaded):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the server did not load {source} within {timeout:.0f} s")


def shifted_on_policy(plan: str = "") -> str:
    """The default policy's source with shifted spans on in every scope, as a quality rule turning
    them on would make it: its own plan, or ``plan`` (a ``semgov calibrate`` method) in its place."""
    text = GOVERNED_POLICY.read_text()
    off = "\nquality_allow_shifted := false\n"
    if off not in text:
        raise ValueError(f"{GOVERNED_POLICY}: no `quality_allow_shifted := false` line to turn on")
    text = text.replace(off, "\nquality_allow_shifted := true\n")
    if plan:  # NOTE: the plan's three constants, as a quality rule would set them
        from semgov.policy.calibration import plan_settings

        for name, value in plan_settings(plan).items():
            old = next((x for x in text.splitlines() if x.startswith(f"{name} := ")), None)
            if old is None:
                raise ValueError(f"{GOVERNED_POLICY}: no `{name} := ...` line for the plan {plan!r}")
            text = text.replace(old, f"{name} := {value}", 1)
    return text


# ---- pairs ----------------------------------------------------------------------------------


def _context(gateway: Any, tenant: str, namespace: str, segments: Any, task: Any, contract: Any) -> str:
    segs = None if segments is None else [(s["role"], s["start"], s["end"]) for s in segments]
    return str(gateway.token(tenant, namespace, segs, task=task, contract=contract))


def _scope(pair: Any) -> dict[str, Any]:
    """The donor's claims (tenant, namespace, task, contract) from its signed provenance payload."""
    payload = pair.request.candidates[0].provenance.payload
    return {
        "tenant": payload["tenant"],
        "namespace": payload["namespace"],
        "task": dict(payload["task"]),
        "contract": dict(payload["response_contract"]),
    }


def run_pair(
    engine: Any, slot: PolicySlot, pair: Any, tok: Any, args: argparse.Namespace, i: int
) -> dict[str, Any]:
    """Every arm of one pair; the row written to ``pairs.jsonl``.

    NOTE: each arm has a namespace (and a donor) of its own: a recipient that was not realized is
    inserted into the engine's prefix cache like any request, and would give a later arm of the
    same prompt an exact hit of everything."""
    from engine_hooks.reference.bench_workload import value_present
    from tests.sglang_server.rig import read_audit, summarize

    gw = engine.server.gateway
    tag = f"q{i}-{pair.pair_id}"
    rec = pair.recipient
    d = _scope(pair)
    tenant = pair.request.tenant
    if pair.cohort == "other_tenant":
        tenant = next(t for t in ("acme", "globex", "initech") if t != d["tenant"])
    task = pair.request.task.model_dump()
    contract = pair.request.response_contract.model_dump()
    n = args.max_new_tokens
    cold = engine.send(rec.token_ids, f"{tag}-cold", None, f"cold-{tag}", n)
    cold2 = (
        engine.send(rec.token_ids, f"{tag}-cold2", None, f"cold2-{tag}", n) if i < args.floor_pairs else None
    )

    def arm(name: str, policy: Path, segments: bool) -> Arm:
        namespace = f"{pair.request.namespace}/{tag}-{name}"
        donor_ns = f"{d['namespace']}/{tag}-{name}-donor" if pair.cohort in NEVER_CANDIDATES else namespace
        slot.use(policy, engine.files.audit_dir)
        dctx = _context(gw, d["tenant"], donor_ns, pair.donor.segments, d["task"], d["contract"])
        # NOTE: one token: a donor only has to finish normally (its prompt's KV is what is reused)
        engine.send(pair.donor.token_ids, f"{tag}-{name}-donor", dctx, "", 1)
        engine.settle()
        ctx = _context(gw, tenant, namespace, rec.segments if segments else None, task, contract)
        return Arm(name, engine.send(rec.token_ids, f"{tag}-{name}", ctx, "", n), f"{tag}-{name}")

    arms = [arm("governed", slot.governed, True)]
    if "similarity" in args.arms and pair.cohort not in NEVER_CANDIDATES:
        arms.append(arm("similarity_only", SIMILARITY_POLICY, True))
    if "exact" in args.arms:
        arms.append(arm("exact_only", slot.governed, False))
    slot.use(slot.governed, engine.files.audit_dir)
    audit = summarize(read_audit(engine.files.audit_dir, wait_s=10))
    cold_text = tok.decode(cold.output_ids, skip_special_tokens=True).strip()
    stated = [v for v in pair.required if value_present(v, cold_text)]
    row: dict[str, Any] = {
        "pair": pair.pair_id,
        "cohort": pair.cohort,
        "expect": pair.expect,
        "tokens": len(rec.token_ids),
        "required": pair.required,
        "cold": {
            "ok": cold.ok,
            "ttft_ms": cold.ttft_ms,
            "answer": cold_text,
            "states_required": bool(stated),
            "error": cold.error,
        },  # fmt: skip
        "cold_cold_identical": None if cold2 is None else cold2.output_ids == cold.output_ids,
        "arms": {},
    }
    for a in arms:
        label = engine.label(a.label, audit)
        text = tok.decode(a.sent.output_ids, skip_special_tokens=True).strip()
        present = [v for v in pair.required if value_present(v, text)]
        decisions = audit.decisions.get(label, [])
        row["arms"][a.name] = {
            "ok": a.sent.ok,
            "error": a.sent.error,
            "ttft_ms": a.sent.ttft_ms,
            "ttft_ratio": a.sent.ttft_ms / cold.ttft_ms if a.sent.ttft_ms and cold.ttft_ms else None,
            "answer": text,
            "changed": a.sent.output_ids != cold.output_ids,
            "lost": [v for v in stated if v not in present],
            "gained": [v for v in present if v not in stated],
            "correct": bool(present),
            "realized": audit.realized.get(label, 0),
            "realizations": sum(1 for r in audit.realizations if r["request_id"] == label),
            "failed": [f.get("detail") for f in audit.failed if f["request_id"] == label],
            "decisions": [x["decision"] for x in decisions],
            "approved": sum(
                int(s["length"]) for x in decisions if x["decision"] == "allow" for s in x["approved_spans"]
            ),
        }
    return row


# ---- summary --------------------------------------------------------------------------------


def _iv(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{100 * lo:.0f}-{100 * hi:.0f}%]"


def summarize_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r["cohort"], []).append(r)
    allow = [r for r in rows if r["cohort"] in ("shifted", "removed_wrapper")]
    groups["new or removed wrapper"] = allow
    for cohort, rs in groups.items():
        arms: dict[str, Any] = {}
        names = sorted({a for r in rs for a in r["arms"]})
        for name in names:
            cells = [(r, r["arms"][name]) for r in rs if name in r["arms"]]
            realized = [c for _, c in cells if c["realized"] > 0]
            ratios = [c["ttft_ratio"] for _, c in cells if c["ttft_ratio"] is not None]
            correct = sum(1 for _, c in cells if c["correct"])
            avoided = sum(c["realized"] for _, c in cells)
            arms[name] = {
                "n": len(cells),
                "realized_pairs": len(realized),
                "realized_tokens": avoided,
                "approved_tokens": sum(c["approved"] for _, c in cells),
                "changed": (ch := sum(1 for _, c in cells if c["changed"])),
                "changed_ci95": wilson(ch, len(cells)),
                "lost": (lo := sum(1 for _, c in cells if c["lost"])),
                "lost_ci95": wilson(lo, len(cells)),
                "gained": sum(1 for _, c in cells if c["gained"]),
                "changed_realized": sum(1 for c in realized if c["changed"]),
                "lost_realized": sum(1 for c in realized if c["lost"]),
                "correct": correct,
                "avoided_per_correct": avoided / correct if correct else None,
                "ttft_ratio_median": statistics.median(ratios) if ratios else None,
                "failed_realizations": sum(len(c["failed"]) for _, c in cells),
            }
        floor = [r["cold_cold_identical"] for r in rs if r["cold_cold_identical"] is not None]
        out[cohort] = {
            "n": len(rs),
            "tokens_median": statistics.median(r["tokens"] for r in rs) if rs else None,
            "cold_states_required": sum(1 for r in rs if r["cold"]["states_required"]),
            "cold_ttft_ms_median": statistics.median(r["cold"]["ttft_ms"] for r in rs if r["cold"]["ttft_ms"])
            if rs
            else None,
            "cold_cold": {"n": len(floor), "identical": sum(floor)},
            "arms": arms,
        }
    return out


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"{'cohort':<24}{'arm':<17}{'n':>4}{'realized':>10}{'tokens':>9}{'changed answers':>20}"
        f"{'changed values':>20}{'avoided/ok':>11}{'TTFT/cold':>10}"
    ]
    for cohort, s in summary.items():
        for name, a in s["arms"].items():
            apc = "-" if a["avoided_per_correct"] is None else f"{a['avoided_per_correct']:.0f}"
            ttft = "-" if a["ttft_ratio_median"] is None else f"{a['ttft_ratio_median']:.2f}"
            lines.append(
                f"{cohort:<24}{name:<17}{a['n']:>4}{a['realized_pairs']:>10}{a['realized_tokens']:>9}"
                f"{_iv(a['changed'], a['n']):>20}{_iv(a['lost'], a['n']):>20}{apc:>11}{ttft:>10}"
            )
    return "\n".join(lines)


def problems(rows: list[dict[str, Any]]) -> list[str]:
    """Invariants: no realization where the cohort forbids reuse, every request answered."""
    out: list[str] = []
    for r in rows:
        if not r["cold"]["ok"]:
            out.append(f"{r['pair']}: cold request failed: {r['cold']['error']}")
        for name, a in r["arms"].items():
            if not a["ok"]:
                out.append(f"{r['pair']} {name}: request failed: {a['error']}")
            if r["cohort"] in DENY_COHORTS and name == "governed" and a["realized"]:
                out.append(
                    f"{r['pair']}: governed arm realized {a['realized']} tokens for a {r['cohort']} pair"
                )
            if r["cohort"] in NEVER_CANDIDATES and a["decisions"]:
                out.append(f"{r['pair']} {name}: decided, but no donor of its scope exists")
    return out


# ---- main -----------------------------------------------------------------------------------


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=("sglang", "vllm"), default="sglang")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--dtype", default="float32", help="the server's --dtype (default float32: faster on CPU)"
    )
    ap.add_argument("--pairs", type=int, default=30, help="pairs per new/removed-wrapper cohort")
    ap.add_argument("--other-pairs", type=int, default=3, help="pairs per exact and question cohort")
    ap.add_argument("--deny-pairs", type=int, default=2, help="pairs per deny-expected cohort")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--floor-pairs", type=int, default=5)
    ap.add_argument("--arms", default="similarity", help="arms besides cold and governed: similarity, exact")
    ap.add_argument(
        "--shifted-on",
        action="store_true",
        help="the governed arm's policy is the default with shifted spans on in every scope (its plan: the "
        "first 16 and last 256 tokens of each computed), as a rule turning them on would make it",
    )
    ap.add_argument(
        "--plan",
        default="",
        metavar="METHOD",
        help="with --shifted-on: another plan (trailing:256, ...: semgov calibrate's methods); on vLLM a "
        "head-free one (its connector cannot compute a head)",
    )
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--warmup", type=int, default=2, help="throwaway pairs first (not counted)")
    ap.add_argument("--decision-timeout-ms", type=int, default=1000)
    ap.add_argument("--audit-wait-ms", type=int, default=1000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="no server: one pair per cohort built with the tiny model's tokenizer, a synthetic result "
        "summarized and written as a run would be (seconds)",
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.pairs, args.other_pairs, args.deny_pairs, args.warmup, args.tokens = 1, 1, 1, 0, 400
    return args


def _pairs(builder: Any, args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """The pairs to measure, cohorts interleaved, and the warm-up pairs."""
    plan = [(c, args.pairs) for c in ("shifted", "removed_wrapper")]
    plan += [(c, args.other_pairs) for c in ("exact", "question")]
    plan += [(c, args.deny_pairs) for c in DENY_COHORTS]
    pairs = []
    for k in range(max(n for _, n in plan)):
        for c, n in plan:
            if k >= n:
                continue
            if c == "other_tenant":  # NOTE: a new-wrapper pair whose recipient another tenant sends
                pairs.append(replace(builder.pair("shifted", 1000 + k), cohort="other_tenant"))
            else:
                pairs.append(builder.pair(c, k))
    return pairs, [builder.pair("shifted", 2000 + k) for k in range(args.warmup)]


def _serve(
    args: argparse.Namespace,
    model_dir: Path,
    work: Path,
    slot: PolicySlot,
    todo: tuple[list[Any], list[Any]],
    tok: Any,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The warm-up pairs, then every pair, through one real server: the rows (with those of
    ``--resume``) and problems."""
    pairs, warm = todo
    progress = args.out / "pairs.jsonl"
    done: dict[str, dict[str, Any]] = {}
    if args.resume and progress.exists():
        done = {(r := json.loads(x))["pair"]: r for x in progress.read_text().splitlines()}
    else:
        progress.write_text("")
    engine_cls = SglangEngine if args.engine == "sglang" else VllmEngine
    engine = engine_cls(model_dir, work / "server", slot.dir, args)
    rows = list(done.values())
    bad: list[str] = []
    with engine.running():
        print(f"[quality] {args.engine} up: {args.model} ({args.dtype}), {len(pairs)} pairs", file=sys.stderr)
        for i, p in enumerate(warm):
            run_pair(engine, slot, p, tok, args, 10_000 + i)
        for i, p in enumerate(pairs):
            if p.pair_id in done:
                continue
            row = run_pair(engine, slot, p, tok, args, i)
            rows.append(row)
            with progress.open("a") as f:
                f.write(json.dumps(row) + "\n")
            g = row["arms"]["governed"]
            mark = "L" if g["lost"] else ("c" if g["changed"] else "=")
            print(
                f"[{i + 1}/{len(pairs)}] {p.pair_id:<20} cold {row['cold']['ttft_ms'] or 0:7.0f} ms  "
                f"governed realized {g['realized']:>5} {mark} {(g['ttft_ratio'] or 0):.2f}x",
                file=sys.stderr,
                flush=True,
            )
            if not engine.alive():
                bad.append(f"the server died or logged an error:\n{engine.tail()}")
                break
    from tests.sglang_server.rig import verify_audit

    why = verify_audit(engine.files)
    if why is not None:
        bad.append(f"audit log does not verify: {why}")
    shutil.copytree(engine.files.audit_dir, args.out / "audit", dirs_exist_ok=True)
    return rows, bad


def synthetic_row(pair: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``--smoke``: the row :func:`run_pair` would write for ``pair`` had every arm answered as cold
    did and the governed arm realized the evidence where its cohort allows (no server)."""
    value = " ".join(pair.required)
    allowed = pair.cohort in ALLOW_COHORTS
    reused = len(pair.recipient.token_ids) // 2 if allowed else 0
    arm = {
        "ok": True, "error": None, "ttft_ms": 50.0, "ttft_ratio": 0.5, "answer": value, "changed": False,
        "lost": [], "gained": [], "correct": True, "realized": reused, "realizations": int(allowed),
        "failed": [], "decisions": ["allow" if allowed else "deny"], "approved": reused,
    }  # fmt: skip
    if pair.cohort in NEVER_CANDIDATES:
        arm.update(realized=0, realizations=0, decisions=[], approved=0, ttft_ratio=1.0)
    arms = {"governed": arm}
    if "similarity" in args.arms and pair.cohort not in NEVER_CANDIDATES:
        arms["similarity_only"] = dict(arm)
    return {
        "pair": pair.pair_id, "cohort": pair.cohort, "expect": pair.expect,
        "tokens": len(pair.recipient.token_ids), "required": pair.required,
        "cold": {"ok": True, "ttft_ms": 100.0, "answer": value, "states_required": True, "error": None},
        "cold_cold_identical": True, "arms": arms,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import signal

    # NOTE: a TERM (a timeout, a kill) unwinds through the `finally` that stops the server's process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from engine_hooks.reference.bench_workload import (
        BenchKeys,
        TextTokenizer,
        WorkloadBuilder,
        evidence_budget,
    )
    from engine_hooks.reference.model import load_model, server_dir

    t0 = time.perf_counter()
    if args.smoke:  # NOTE: no model directory (real weights, converted once): the tiny model's tokenizer
        model_dir, tok = Path("-"), load_model("tiny").tokenizer
    else:
        model_dir = server_dir(args.model)
        tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    tz = TextTokenizer(tok)
    builder = WorkloadBuilder(tz, evidence_budget(tz, args.tokens), BenchKeys.generate(), seed=args.seed)
    pairs, warm = _pairs(builder, args)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"semgov-quality-{args.engine}-"))
    governed = GOVERNED_POLICY
    if args.shifted_on:
        governed = work / "governed-shifted-on.rego"
        governed.write_text(shifted_on_policy(args.plan))
    slot = PolicySlot(work / "policy", governed)
    slot.put(governed)
    if args.smoke:
        rows, bad = [synthetic_row(p, args) for p in pairs], []
    else:
        rows, bad = _serve(args, model_dir, work, slot, (pairs, warm), tok)
    bad += problems(rows)
    code = _report(args, rows, bad, time.perf_counter() - t0)
    shutil.rmtree(work, ignore_errors=True)
    return code


def _report(args: argparse.Namespace, rows: list[dict[str, Any]], bad: list[str], wall: float) -> int:
    """``OUT/summary.json`` and the table; exit status 1 when something broke."""
    summary = summarize_rows(rows)
    doc = {
        "engine": args.engine,
        "model": args.model,
        "dtype": args.dtype,
        "governed_policy": (
            f"default, shifted spans on, plan {args.plan or 'bookend:16+256'}"
            if args.shifted_on
            else "default"
        ),  # fmt: skip
        "args": {k: str(v) for k, v in vars(args).items()},
        "smoke": args.smoke,
        "cohorts": summary,
        "problems": bad,
        "load_average": os.getloadavg()[0],
        "wall_s": wall,
    }
    (args.out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    version = "SGLang 0.5.23" if args.engine == "sglang" else "vLLM 0.32"
    weights = "smoke: no server, a synthetic result" if args.smoke else "real weights"
    print(f"{version}, {args.model} ({args.dtype}), {weights}, governed by: {doc['governed_policy']} policy")
    print(table(summary))
    print(f"load average {doc['load_average']:.2f}; wall {doc['wall_s']:.0f} s")
    for b in bad:
        print("PROBLEM:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
