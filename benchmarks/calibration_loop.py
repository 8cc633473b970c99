"""The whole loop a team runs to turn semantic reuse on, in a real SGLang server with real weights.

Usage: ``python benchmarks/calibration_loop.py --model qwen2.5-coder-0.5b --calibrate-pairs 20
--heldout-pairs 40 --out DIR [--methods bookend:16+256,trailing:512] [--budget 0.2] [--tokens 2000]
[--resume] [--smoke]``

1. **A captured workload in two halves** that share no document: the ``semgov bench`` workload
   (research files whose figures the questions ask for, the model's chat template and tokenizer),
   ``shifted`` (a new instruction wrapper) and ``removed_wrapper`` pairs; the calibration half and
   the held-out half are built from entities drawn with different seeds (other sectors, other
   figures), ``--calibrate-pairs`` and ``--heldout-pairs`` per cohort.
2. **One real server**: SGLang 0.5.23 with ``--radix-cache-backend semgov``, the model's real
   weights (converted once from the registry GGUF), the shipped default policy
   (``policies/default``: shifted reuse off), the real MinHash candidate provider and the PII scan
   on the donors' real text.
3. **Calibrate** the first half against that server, as a team would: ``semgov calibrate CAPTURE
   --engine sglang --server URL --context-key ... --audit ... --contracts
   engine_hooks/reference/bench_contracts.yaml``: per pair the donor, the recipient cold and
   governed under each plan, in the run's own namespace, answers compared by the contract.
4. **Deploy** the policy it wrote (``OUT/calibrate/yaml/policy.yaml``) by hot reload: renamed
   over the server's live file; the loop waits for the audited ``policy_loaded``.
5. **The held-out half** with the written policy, as production traffic: per pair, in a namespace
   of its own, the donor, the recipient cold (an exact-prefix key of its own) and the recipient
   with its context, decided by the live (calibrated) policy. Reuse is counted only from the audit
   log's ``realization`` events; answers are compared by the response contract (changed required
   values) and token for token (changed answers), and the workload's known value is checked too.

Prints the calibration table, then for the held-out half: n, realized pairs, changed required
values and changed answers with 95% Wilson intervals, the prefill tokens realized as a share of
those approved, and TTFT governed/cold (median of each pair's own ratio); against the targets of
issue 47 (0 changed required values with a 95% upper bound under 5%, realized >= 50% of approved,
TTFT/cold <= 0.4). Writes ``OUT/heldout.jsonl`` as it goes (``--resume`` continues both phases)
and ``OUT/summary.json``. Exit 1 when the server died, the audit log does not verify, or a pair's
decision crossed its scope.

``--smoke``: the same loop on the tiny random model (dummy weights, SmolLM2's tokenizer, the rig's
policy without the PII scan, since its donors have no text), a few pairs: it proves the loop runs
against a real server; its answers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from semgov.stats import wilson  # noqa: E402 - the checkout on sys.path first

DEFAULT_POLICY = ROOT / "policies" / "default" / "policy.yaml"
CONTRACTS = ROOT / "engine_hooks" / "reference" / "bench_contracts.yaml"
COHORTS = ("shifted", "removed_wrapper")
TARGETS = {"values_upper": 0.05, "realized_share": 0.5, "ttft_ratio": 0.4, "n": 80}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument(
        "--dtype", default="float32", help="the server's --dtype (default float32: faster on CPU)"
    )
    ap.add_argument("--calibrate-pairs", type=int, default=20, help="calibration pairs per cohort")
    ap.add_argument("--heldout-pairs", type=int, default=40, help="held-out pairs per cohort")
    ap.add_argument("--methods", default="bookend:16+256,trailing:512")
    ap.add_argument("--budget", default="0.2")
    ap.add_argument("--tokens", type=int, default=2000, help="prompt tokens")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument(
        "--smoke", action="store_true", help="the tiny random model, 2 pairs per half (no real weights)"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.calibrate_pairs, args.heldout_pairs, args.tokens = "tiny", 1, 1, 600
        args.max_new_tokens = 6
        args.budget = "1.0"  # NOTE: every measured plan is kept, so the held-out half realizes reuse too
    return args


# ---- the workload ------------------------------------------------------------------------------


def build(args: argparse.Namespace, tok: Any, out: Path, keyring_extra: Path) -> tuple[Path, list[Any], Path]:
    """The two halves: the calibration capture file, the held-out pairs and the keyring that
    trusts the workload's provenance key and the server's key."""
    from engine_hooks.reference.bench_workload import (
        BenchKeys,
        TextTokenizer,
        WorkloadBuilder,
        evidence_budget,
    )

    tz = TextTokenizer(tok)
    keys = BenchKeys.generate()
    budget = evidence_budget(tz, args.tokens)
    cal = WorkloadBuilder(tz, budget, keys, seed=args.seed)
    held = WorkloadBuilder(tz, budget, keys, seed=args.seed + 1000)  # NOTE: other entities' documents
    cal_pairs = [cal.pair(c, k) for k in range(args.calibrate_pairs) for c in COHORTS]
    held_pairs = [held.pair(c, k) for k in range(args.heldout_pairs) for c in COHORTS]
    seen = {tuple(p.recipient.token_ids) for p in cal_pairs}
    assert not any(tuple(p.recipient.token_ids) in seen for p in held_pairs), "the halves share a prompt"
    capture = out / "capture-calibrate.jsonl"
    capture.write_text("".join(p.request.model_dump_json(by_alias=True) + "\n" for p in cal_pairs))
    from semgov.signing.keys import public_pem

    keyring = json.loads(keyring_extra.read_text())
    keyring["keys"].append({"key_id": keys.k1.key_id, "public_key": public_pem(keys.k1.public_key)})
    trust = out / "keyring.json"
    trust.write_text(json.dumps(keyring, indent=1))
    return capture, held_pairs, trust


# ---- the server ----------------------------------------------------------------------------------


def start_server(args: argparse.Namespace, work: Path, policy_dir: Path) -> Any:
    """A real SGLang server with the semgov backend on the model (the rig of ``tests/sglang_server``)."""
    from tests.sglang_server.rig import HookFiles, Server, ServerConfig, free_port

    env = {
        "SEMGOV_PROVIDER": "minhash",
        "SEMGOV_DETOKENIZER": "none" if args.smoke else "auto",
        "SEMGOV_DECISION_TIMEOUT_MS": "2000",
        "SEMGOV_AUDIT_WAIT_MS": "2000",
        "SEMGOV_RELOAD_POLL_MS": "200",
    }
    if args.smoke:
        cfg = ServerConfig(page_size=1, chunked_prefill_size=1024, max_total_tokens=65536, hook_env=env)
    else:
        from engine_hooks.reference.model import server_dir

        cfg = ServerConfig(
            model=server_dir(args.model), dummy_weights=False, dtype=args.dtype, page_size=1,
            chunked_prefill_size=1024, max_total_tokens=65536, hook_env=env,
        )  # fmt: skip
    server = Server(cfg, work, HookFiles.make(work / "hook", policy=policy_dir), free_port())
    server.start()
    return server


def deploy(server: Any, written: Path, policy_dir: Path, timeout: float = 120.0) -> str:
    """The calibrated policy renamed over the live one; its revision once the server audits
    ``policy_loaded`` for it."""
    from semgov.policy.yaml.model import load_policy
    from tests.sglang_server.rig import read_audit

    revision = load_policy(written).revision
    tmp = policy_dir / ".policy.yaml.tmp"
    shutil.copyfile(written, tmp)
    os.replace(tmp, policy_dir / "policy.yaml")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        loaded = [r for r in read_audit(server.files.audit_dir, wait_s=0) if r.get("kind") == "policy_loaded"]
        if any(f"revision {revision}" in str(r.get("detail")).split(";")[0] for r in loaded):
            return revision
        time.sleep(0.5)
    raise RuntimeError(f"the server did not load {written} within {timeout:.0f} s")


# ---- phase 1: calibrate ------------------------------------------------------------------------------


def calibrate(
    args: argparse.Namespace, server: Any, capture: Path, trust: Path, policy: Path
) -> dict[str, Any]:
    """``semgov calibrate`` against the server, as a subprocess (what a team types); its report."""
    out = args.out / "calibrate"
    done = out / "calibration.json"
    if args.resume and done.exists():
        return dict(json.loads(done.read_text()))
    f = server.files
    cmd = [
        sys.executable, "-m", "semgov.cli.main", "calibrate", str(capture), "--policy", str(policy),
        "--trust", str(trust), "--out", str(out), "--engine", "sglang",
        "--server", f"http://{server.host}:{server.port}", "--context-key", str(f.context_key),
        "--audience", "semgov-test", "--audit", str(f.audit_dir), "--contracts", str(CONTRACTS),
        "--methods", args.methods, "--budget", args.budget, "--sample", str(2 * args.calibrate_pairs),
        "--max-new-tokens", str(args.max_new_tokens),
    ]  # fmt: skip
    if args.resume and (out / "run.json").exists():
        cmd.append("--resume")
    print("$ semgov " + " ".join(cmd[3:]), file=sys.stderr, flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    if rc != 0:
        raise RuntimeError(f"semgov calibrate exited {rc}")
    return dict(json.loads(done.read_text()))


# ---- phase 2: the held-out half, with the written policy ------------------------------------------


def _segs(spec: Any) -> list[tuple[str, int, int]]:
    return [(s["role"], s["start"], s["end"]) for s in spec.segments]


def heldout_pair(server: Any, audit: Any, contracts: Any, tok: Any, pair: Any, k: int, run: str,
                 args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """One held-out pair in a namespace of its own: donor, cold, governed; the row."""
    from engine_hooks.reference.bench_workload import value_present
    from tests.sglang_server.rig import settle

    req, gw, n = pair.request, server.gateway, args.max_new_tokens
    ns = f"{req.namespace}/heldout-{run}-{k}"
    payload = req.candidates[0].provenance.payload
    task, contract = req.task.model_dump(), req.response_contract.model_dump()
    dtok = gw.token(req.tenant, ns, _segs(pair.donor), task=dict(payload["task"]),
                    contract=dict(payload["response_contract"]))  # fmt: skip
    donor = server.generate(pair.donor.token_ids, rid=f"ho-{run}-{k}-donor", extra_key=dtok, max_new_tokens=1)
    settle(server)
    cold = server.generate(pair.recipient.token_ids, rid=f"ho-{run}-{k}-cold", extra_key=f"ho-cold-{run}-{k}",
                           max_new_tokens=n, ignore_eos=False)  # fmt: skip
    rid = f"ho-{run}-{k}"
    rtok = gw.token(req.tenant, ns, _segs(pair.recipient), task=task, contract=contract)
    warm = server.generate(
        pair.recipient.token_ids, rid=rid, extra_key=rtok, max_new_tokens=n, ignore_eos=False
    )
    seen = audit.outcome(rid, expect_decision=True, wait_s=30.0)
    texts = [tok.decode(r.output_ids, skip_special_tokens=True).strip() for r in (cold, warm)]
    c = contracts.spec(contract).compare_answers(*texts, cold_ids=cold.output_ids, warm_ids=warm.output_ids)
    stated = [v for v in pair.required if value_present(v, texts[0])]
    scope = (req.tenant, ns)
    crossed = [
        d["decision_id"] for d in seen.decisions
        if (d.get("tenant"), d.get("namespace")) != scope
        or (d.get("decision") == "allow" and (d.get("donor_tenant"), d.get("donor_namespace")) != scope)
    ]  # fmt: skip
    return {
        "pair": pair.pair_id, "cohort": pair.cohort, "task": req.task.id,
        "tokens": len(pair.recipient.token_ids),
        "ok": donor.ok and cold.ok and warm.ok, "error": donor.error or cold.error or warm.error,
        "cold": {"ttft_ms": cold.ttft_ms, "answer": texts[0], "cached_tokens": cold.cached_tokens},
        "governed": {
            "ttft_ms": warm.ttft_ms, "answer": texts[1],
            "ttft_ratio": warm.ttft_ms / cold.ttft_ms if warm.ttft_ms and cold.ttft_ms else None,
            "decisions": [d.get("decision") for d in seen.decisions],
            "revision": sorted(seen.revisions()), "approved": seen.approved_tokens,
            "realized": seen.realized_tokens, "failed": sorted(set(seen.failed.values())),
            "changed_answer": c.answer_changed, "changed_values": c.values_changed, "detail": c.detail,
            "known_value_lost": [v for v in stated if not value_present(v, texts[1])],
        },
        "crossed": crossed,
    }  # fmt: skip


def heldout(
    args: argparse.Namespace, server: Any, trust: Path, pairs: list[Any], tok: Any
) -> list[dict[str, Any]]:
    """Every held-out pair (those of ``--resume`` kept), appended to ``OUT/heldout.jsonl`` as it ends."""
    from semgov.calibrate.audit import ServerAudit
    from semgov.contracts import load_contracts
    from semgov.signing.keys import Keyring

    progress = args.out / "heldout.jsonl"
    rows = (
        [json.loads(x) for x in progress.read_text().splitlines()]
        if args.resume and progress.exists()
        else []
    )
    if not rows:
        progress.write_text("")
    done = {r["pair"] for r in rows}
    audit = ServerAudit([server.files.audit_dir], Keyring.load(trust))
    contracts = load_contracts(CONTRACTS)
    run = f"{int(time.time()) % 100000}"
    for k, pair in enumerate(pairs):
        if pair.pair_id in done:
            continue
        row = heldout_pair(server, audit, contracts, tok, pair, k, run, args)
        rows.append(row)
        with progress.open("a") as f:
            f.write(json.dumps(row) + "\n")
        g = row["governed"]
        mark = "V" if g["changed_values"] else ("c" if g["changed_answer"] else "=")
        cold_ms = row["cold"]["ttft_ms"] or 0
        print(f"[held-out {len(rows)}/{len(pairs)}] {pair.pair_id:<20} cold {cold_ms:7.0f} ms"
              f"  realized {g['realized']:>5}/{g['approved']:<5} {mark} {(g['ttft_ratio'] or 0):.2f}x",
              file=sys.stderr, flush=True)  # fmt: skip
        if not server.alive():
            break
    return rows


# ---- the summary ---------------------------------------------------------------------------------


def _iv(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} [{100 * lo:.1f}-{100 * hi:.1f}%]"


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The held-out half's figures, per cohort and in all."""
    out: dict[str, Any] = {}
    for name, rs in [("all", rows), *((c, [r for r in rows if r["cohort"] == c]) for c in COHORTS)]:
        g = [r["governed"] for r in rs]
        ratios = sorted(x["ttft_ratio"] for x in g if x["ttft_ratio"] is not None)
        n = len(g)
        values = sum(1 for x in g if x["changed_values"])
        answers = sum(1 for x in g if x["changed_answer"])
        approved, realized = sum(x["approved"] for x in g), sum(x["realized"] for x in g)
        out[name] = {
            "n": n,
            "realized_pairs": sum(1 for x in g if x["realized"] > 0),
            "changed_required_values": values,
            "changed_required_values_ci95": wilson(values, n),
            "changed_answers": answers,
            "changed_answers_ci95": wilson(answers, n),
            "known_value_lost": sum(1 for x in g if x["known_value_lost"]),
            "approved_tokens": approved,
            "realized_tokens": realized,
            "realized_share": realized / approved if approved else None,
            "ttft_ratio_median": statistics.median(ratios) if ratios else None,
            "ttft_ratio_p10_p90": (ratios[len(ratios) // 10], ratios[(9 * len(ratios)) // 10])
            if ratios else None,
            "cold_ttft_ms_median": statistics.median(r["cold"]["ttft_ms"] for r in rs if r["cold"]["ttft_ms"])
            if rs else None,
        }  # fmt: skip
    return out


def report(args: argparse.Namespace, cal: dict[str, Any], rows: list[dict[str, Any]], bad: list[str],
           wall: float) -> int:  # fmt: skip
    summary = summarize(rows)
    a = summary["all"]
    checks = {
        f"n >= {TARGETS['n']}": a["n"] >= TARGETS["n"],
        "0 changed required values, 95% upper bound < 5%": a["changed_required_values"] == 0
        and a["changed_required_values_ci95"][1] < TARGETS["values_upper"],
        "realized >= 50% of approved": (a["realized_share"] or 0) >= TARGETS["realized_share"],
        "TTFT governed/cold <= 0.4 (median)": a["ttft_ratio_median"] is not None
        and a["ttft_ratio_median"] <= TARGETS["ttft_ratio"],
    }  # fmt: skip
    doc = {"model": args.model, "dtype": args.dtype, "smoke": args.smoke,
           "args": {k: str(v) for k, v in vars(args).items()},
           "calibration": cal, "heldout": summary, "targets": checks, "problems": bad,
           "load_average": os.getloadavg()[0], "wall_s": round(wall, 1)}  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"SGLang 0.5.23, {args.model} ({args.dtype}), "
        + ("SMOKE: random weights" if args.smoke else "real weights")
    )
    print(f"calibration ({cal.get('measured')} pairs measured, run {cal.get('run')}):")
    for sc in cal.get("scopes", []):
        for m, c in sc["shifted"].items():
            print(
                f"  {sc['task']}/{sc['response_contract']} {m}: regressions {_iv(c['regressions'], c['n'])}, "
                f"changed answers {c['changed_answers']}, "
                f"changed required values {c['changed_required_values']}"
            )
        print(f"  rule written: {json.dumps(sc['rule'])}")
    print(
        f"{'held-out':<18}{'n':>4}{'realized':>10}{'changed values':>24}{'changed answers':>24}"
        f"{'realized/approved':>19}{'TTFT/cold':>10}"
    )
    for name, x in summary.items():
        share = "-" if x["realized_share"] is None else f"{100 * x['realized_share']:.0f}%"
        ratio = "-" if x["ttft_ratio_median"] is None else f"{x['ttft_ratio_median']:.2f}"
        print(
            f"{name:<18}{x['n']:>4}{x['realized_pairs']:>10}{_iv(x['changed_required_values'], x['n']):>24}"
            f"{_iv(x['changed_answers'], x['n']):>24}{share:>19}{ratio:>10}"
        )
    for what, ok in checks.items():
        print(f"target {'met' if ok else 'NOT met'}: {what}")
    print(f"load average {doc['load_average']:.2f}; wall {wall:.0f} s")
    for b in bad:
        print("PROBLEM:", b)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    import signal

    args = _parse(argv)
    # NOTE: a TERM (a timeout, a kill) unwinds through the `finally` that stops the server's process group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        from engine_hooks.reference.model import load_model

        tok, policy = load_model("tiny").tokenizer, _no_scan_policy(args.out)
    else:
        from transformers import AutoTokenizer

        from engine_hooks.reference.model import server_dir

        tok = AutoTokenizer.from_pretrained(str(server_dir(args.model)), local_files_only=True)
        policy = DEFAULT_POLICY
    work = Path(tempfile.mkdtemp(prefix="semgov-calibration-loop-"))
    policy_dir = work / "policy"
    policy_dir.mkdir()
    shutil.copyfile(policy, policy_dir / "policy.yaml")
    bad: list[str] = []
    server = start_server(args, work / "server", policy_dir)
    try:
        capture, held, trust = build(args, tok, args.out, server.files.trust)
        cal = calibrate(args, server, capture, trust, policy_dir)
        revision = deploy(server, args.out / "calibrate" / "yaml" / "policy.yaml", policy_dir)
        print(f"deployed the calibrated policy: revision {revision}", file=sys.stderr, flush=True)
        rows = heldout(args, server, trust, held, tok)
        bad += _problems(server, rows)
    finally:
        server.stop()
    shutil.copytree(server.files.audit_dir, args.out / "audit", dirs_exist_ok=True)
    from tests.sglang_server.rig import verify_audit

    why = verify_audit(server.files)
    if why is not None:
        bad.append(f"the audit log does not verify: {why}")
    code = report(args, cal, rows, bad, time.perf_counter() - t0)
    shutil.rmtree(work, ignore_errors=True)
    return code


def _no_scan_policy(out: Path) -> Path:
    """``--smoke``: the shipped default policy without the PII scan (the tiny model's server has no
    tokenizer, so its donors have no text to scan); everything else as shipped."""
    text = DEFAULT_POLICY.read_text()
    for a, b in (
        ("  scan_donor_text: true\n", "  scan_donor_text: false\n"),
        ("  require_scan: true\n", "  require_scan: false\n"),
    ):
        if a not in text:
            raise ValueError(f"{DEFAULT_POLICY}: no {a.strip()!r} line")
        text = text.replace(a, b, 1)
    path = out / "smoke-policy.yaml"
    path.write_text(text)
    return path


def _problems(server: Any, rows: list[dict[str, Any]]) -> list[str]:
    out = [f"{r['pair']}: a request failed: {r['error']}" for r in rows if not r["ok"]]
    out += [f"{r['pair']}: decisions {r['crossed']} crossed the pair's scope" for r in rows if r["crossed"]]
    if not server.alive() or server.fatal_lines():
        out.append(f"the server died or logged an error:\n{server.tail()}")
    return out


if __name__ == "__main__":
    sys.exit(main())
