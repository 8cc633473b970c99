"""The server check for vLLM (``server_check.sh --engine vllm``): cold, stock prefix cache, semgov.

Starts two real vLLM 0.32 servers on CPU one after the other, both with semgov's scope middleware
(so exact prefixes are shared within a tenant and namespace only): ``stock`` (vLLM's own prefix
cache, no connector) and ``semgov`` (plus semgov's connector). Each runs the paired cohorts of
the SGLang check (allowed, other tenant, unrelated, no context; donor ``[S][I][E][Q1]``, recipient
``[S][E][Q2]``), with a cold arm (the recipient in a fresh namespace primed with ``[S][Q1]``, so it
has the same exact-prefix hit as the warm arm) and a warm arm (after the donor). It prints TTFT per
cohort (cold, stock, semgov), approved and realized tokens from the audit log, checks the
expectations (allowed pairs realize their evidence; the others realize nothing, other tenant and no
context are never decided), verifies the audit log, and ends with::

    invariant status: OK (...)        or        invariant status: VIOLATED (...)

Exit status as the SGLang check: 0 OK; 1 violated; 2 could not run; 3 held, but nothing realized.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.sglang_server.check import EXIT_USAGE, REAL_MODELS, print_sched, sched_stats, verdict
from tests.sglang_server.rig import RigError, pair_prompts, verify_audit
from tests.sglang_server.scenarios import seed_lengths
from tests.vllm.rig import TINY, Reply, VllmServer, VllmServerConfig, by_client_id, launch_vllm, vllm_python

COHORTS = ("allowed", "other_tenant", "unrelated", "no_context")


@dataclass
class Arms:
    """TTFTs (ms) per (cohort, arm) and the audit's figures per cohort, over both servers."""

    ttft: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    approved: dict[str, int] = field(default_factory=dict)
    realized: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    requests: int = 0
    sched_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, cohort: str, arm: str, r: Reply) -> None:
        self.requests += 1
        if r.status != 200 or r.ttft_ms is None:
            self.problems.append(f"{r.request_id}: HTTP {r.status} {r.error or 'no token'}")
            return
        self.ttft.setdefault((cohort, arm), []).append(r.ttft_ms)

    def median(self, cohort: str, arm: str) -> float | None:
        xs = self.ttft.get((cohort, arm))
        return statistics.median(xs) if xs else None


def run_cohorts(server: VllmServer, arm: str, pairs: int, e_len: int, out: Arms) -> list[tuple[str, str]]:
    """The cohorts on one server: cold and warm arms; returns (cohort, warm client id) pairs."""
    warm_ids: list[tuple[str, str]] = []
    for i in range(3):  # NOTE: warm-up (first requests of a server are slower), not measured
        w = pair_prompts(f"{arm}-warmup-{i}", e_len=e_len)
        server.complete(w.recipient, f"{arm}-warmup-{i}", cache_salt=f"warmup-{i}")
    for seed in range(pairs):
        for cohort in COHORTS:
            tag = f"{arm}-{cohort}-{seed}"
            p = pair_prompts(tag, e_len=e_len, unrelated=cohort == "unrelated")
            tenant = "globex" if cohort == "other_tenant" else "acme"
            ns, ns_cold = f"ns-{tag}", f"ns-{tag}-cold"

            def send(prompt: list[int], cid: str, t: str, n: str, segs: Any, _c: str = cohort) -> Reply:
                if (
                    _c == "no_context"
                ):  # NOTE: no token; a client salt per namespace, as SGLang's check keys it
                    return server.complete(prompt, cid, None, cache_salt=f"plain-{n}")
                return server.complete(prompt, cid, server.token(t, n, segs))

            if cohort != "other_tenant":  # the warm arm's exact hit covers [S]: give cold the same
                send(p.primer, f"{tag}-primer", tenant, ns_cold, p.primer_segs)
            out.add(
                cohort, f"cold-{arm}", send(p.recipient, f"{tag}-cold", tenant, ns_cold, p.recipient_segs)
            )
            send(p.donor, f"{tag}-donor", "acme", ns, p.donor_segs)
            out.add(cohort, arm, send(p.recipient, f"{tag}-warm", tenant, ns, p.recipient_segs))
            warm_ids.append((cohort, f"{tag}-warm"))
    return warm_ids


def run_seed(server: VllmServer, tokens: int, out: Arms) -> str:
    """The seed's shape on the semgov server (a recipient of ``tokens`` tokens, 97% evidence from a
    donor behind another wrapper): TTFT cold and governed; returns the governed client id.

    NOTE: vLLM loads only a run that continues its exact hit, so evidence after fresh tokens is
    never realized here (docs/vllm.md); the figure says what a vLLM user gets for this shape."""
    s_len, w_len, e_len, q_len = seed_lengths(tokens)
    p = pair_prompts("seed", s_len=s_len, i_len=w_len, e_len=e_len, q_len=q_len, wrapper=w_len)
    server.complete(p.primer, "seed-primer", server.token("acme", "ns-seed-cold", p.primer_segs))
    out.add(
        "seed",
        "cold-semgov",
        server.complete(p.recipient, "seed-cold", server.token("acme", "ns-seed-cold", p.recipient_segs)),
    )
    server.complete(p.donor, "seed-donor", server.token("acme", "ns-seed", p.donor_segs))
    out.add(
        "seed",
        "semgov",
        server.complete(p.recipient, "seed-warm", server.token("acme", "ns-seed", p.recipient_segs)),
    )
    return "seed-warm"


def judge_seed(server: VllmServer, cid: str, out: Arms) -> None:
    """The seed's governed recipient: decided, nothing realized (vLLM cannot load after fresh tokens)."""
    audit = server.audit()
    label = by_client_id(audit, cid)
    realized = audit.realized.get(label, 0) if label else 0
    out.realized["seed"] = realized
    if label is None or not audit.decisions.get(label):
        out.problems.append(f"{cid}: the seed-shaped recipient was not decided")
    c, w = out.median("seed", "cold-semgov"), out.median("seed", "semgov")
    if c and w:
        out.notes.append(
            f"seed shape: TTFT cold {c:.0f} ms, governed {w:.0f} ms, governed/cold {w / c:.2f}, "
            f"{realized} tokens realized (vLLM loads only a run continuing its exact hit)"
        )


def judge(server: VllmServer, warm_ids: list[tuple[str, str]], e_len: int, out: Arms) -> None:
    """The semgov server's audit against the cohorts' expectations."""
    audit = server.audit()
    for cohort, cid in warm_ids:
        label = by_client_id(audit, cid)
        decisions = audit.decisions.get(label, []) if label else []
        realized = audit.realized.get(label, 0) if label else 0
        approved = sum(
            int(s["length"]) for d in decisions if d["decision"] == "allow" for s in d["approved_spans"]
        )
        out.approved[cohort] = out.approved.get(cohort, 0) + approved
        out.realized[cohort] = out.realized.get(cohort, 0) + realized
        if cohort == "allowed" and realized != e_len:
            out.problems.append(f"{cid}: realized {realized}, expected {e_len}")
        if cohort != "allowed" and realized:
            out.problems.append(f"{cid} ({cohort}): realized {realized} tokens")
        if cohort in ("other_tenant", "no_context") and decisions:
            out.problems.append(f"{cid} ({cohort}) was decided")
        if cohort == "unrelated" and any(d["decision"] == "allow" for d in decisions):
            out.problems.append(f"{cid}: unrelated evidence allowed")
    failed = [f for f in audit.failed if "-seed-" not in f"-{f.get('request_id')}-"]
    if failed:
        out.problems.append(f"{len(failed)} failed realization(s): {failed[0].get('detail')}")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def report(out: Arms, pairs: int) -> None:
    print()
    head = (
        "cohort",
        "cold ms",
        "stock ms",
        "stock/cold",
        "cold ms",
        "semgov ms",
        "semgov/cold",
        "approved",
        "realized",
    )
    print("{:<14} {:>8} {:>9} {:>10} | {:>8} {:>9} {:>11} {:>9} {:>9}".format(*head))
    for c in COHORTS:
        c1, st = out.median(c, "cold-stock"), out.median(c, "stock")
        c2, sem = out.median(c, "cold-semgov"), out.median(c, "semgov")
        r1 = f"{st / c1:.2f}" if c1 and st else "-"
        r2 = f"{sem / c2:.2f}" if c2 and sem else "-"
        cells = (
            c,
            _fmt(c1),
            _fmt(st),
            r1,
            _fmt(c2),
            _fmt(sem),
            r2,
            out.approved.get(c, 0),
            out.realized.get(c, 0),
        )
        print("{:<14} {:>8} {:>9} {:>10} | {:>8} {:>9} {:>11} {:>9} {:>9}".format(*cells))
    print(f"(TTFT medians over {pairs} pair(s) per cohort; left: the stock server (cold arm, warm arm),")
    print(" right: the semgov server; approved/realized: tokens over the semgov server's warm recipients,")
    print(" from its audit log)")
    for n in out.notes:
        print(f"note: {n}")


def run_arm(
    cfg: VllmServerConfig, arm: str, work: Path, py: Path, args: argparse.Namespace, out: Arms
) -> None:
    """One server: the cohorts, and for semgov's the audit's expectations and ``semgov audit verify``.

    NOTE: both servers set ``VLLM_CPU_NUM_OF_RESERVED_CPU=1``: vLLM reserves one more CPU core when
    a KV connector is configured (for NIXL), which on a small machine changes the worker's threads.
    """
    print(
        f"[server_check] starting vLLM {arm} ({'with' if cfg.connector else 'no'} semgov connector)",
        flush=True,
    )
    with launch_vllm(cfg, work, py) as srv:
        print(f"[server_check] {arm}: up after {srv.started_s:.0f}s", flush=True)
        warm = run_cohorts(srv, arm, args.pairs, args.e_len, out)
        seed = run_seed(srv, args.seed_tokens, out) if cfg.connector and args.seed_tokens else None
        if cfg.connector:
            judge(srv, warm, args.e_len, out)
        if seed is not None:
            judge_seed(srv, seed, out)
        if not srv.alive():
            out.problems.append(f"{arm}: the server died")
        bad = srv.fatal_lines()
        if bad:
            out.problems.append(f"{arm}: {len(bad)} error line(s) in the server log: {bad[0]}")
    st = sched_stats(work / "sched_ns.log") if cfg.connector else None
    if st is not None:
        out.sched_ms["vllm-semgov"] = st
    if cfg.connector:
        why = verify_audit(srv.files)
        if why is not None:
            out.problems.append(f"semgov audit verify failed: {why}")
        else:
            print("[server_check] semgov: audit log verifies", flush=True)


def save_results(dest: Path, work: Path, out: Arms) -> None:
    """results.json, both servers' logs and commands, and the semgov server's audit log."""
    dest.mkdir(parents=True, exist_ok=True)
    rows = {f"{c}/{a}": v for (c, a), v in out.ttft.items()}
    doc = {
        "ttft_ms": rows,
        "approved": out.approved,
        "realized": out.realized,
        "sched_ms": out.sched_ms,
        "problems": out.problems,
    }
    (dest / "results.json").write_text(json.dumps(doc, indent=2))
    for arm in ("stock", "semgov"):
        for f in ("server.log", "command.txt"):
            if (work / arm / f).exists():
                shutil.copy(work / arm / f, dest / f"vllm-{arm}.{f}")
    if (work / "semgov" / "hook" / "audit").exists():
        shutil.copytree(work / "semgov" / "hook" / "audit", dest / "vllm-semgov.audit", dirs_exist_ok=True)


def cuda_preflight(py: Path) -> str | None:
    """Why vLLM's environment cannot serve on a GPU here (None when its torch sees one)."""
    import subprocess

    probe = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"
    try:
        run = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"could not ask vLLM's environment ({py}): {e}"
    words = run.stdout.split()
    if run.returncode != 0 or len(words) != 3:
        return f"vLLM's environment ({py}) could not import torch: {run.stderr.strip()[-300:]}"
    if words[2] != "True":
        return f"vLLM's environment ({py}) sees no CUDA device (torch {words[0]}, CUDA {words[1]})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="server_check --engine vllm",
        description="Run semgov's vLLM connector in real vLLM servers (stock and semgov) and compare "
        "TTFT per cohort: cold, stock prefix cache, semgov; check the audit log.",
    )
    ap.add_argument("--model", choices=("tiny", *REAL_MODELS), default="tiny",
                    help="tiny: 2-layer Llama, head_dim 64 (dummy weights); smollm2 (smollm2-135m), "
                    "qwen2.5-coder-0.5b, qwen2.5-coder-1.5b: real weights (converted once from the "
                    "registry GGUF, cached: docs/models.md)")  # fmt: skip
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: vLLM's CPU build (default); cuda: its CUDA build on a GPU, in the same "
                    "environment (docs/vllm.md, GPU install)")  # fmt: skip
    ap.add_argument("--pairs", type=int, default=2, help="pairs per cohort (default 2)")
    ap.add_argument("--e-len", type=int, default=1024, help="evidence tokens per pair (default 1024)")
    ap.add_argument(
        "--eager",
        action="store_true",
        help="--enforce-eager: no torch.compile or CUDA graphs (a faster start; rehearsals, not timings)",
    )
    ap.add_argument(
        "--seed-tokens",
        type=int,
        default=0,
        help="also send the seed's shape to the semgov server: one recipient of this many tokens, 97%% "
        "of them evidence from a donor behind another wrapper (e.g. 4900; default 0: not sent)",
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="write results.json, server logs and audit logs here"
    )
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.e_len < 256:
        ap.error("--pairs must be at least 1 and --e-len at least 256")
    if args.seed_tokens:
        try:
            seed_lengths(args.seed_tokens)
        except ValueError as e:
            ap.error(f"--seed-tokens: {e}")
    py = vllm_python()
    if py is None:
        print(
            "[server_check] cannot run: no vLLM environment (.venv-vllm or SEMGOV_VLLM_PYTHON; docs/vllm.md)"
        )
        print("invariant status: VIOLATED (not checked: see above)")
        return EXIT_USAGE
    why = cuda_preflight(py) if args.device == "cuda" else None
    if why is not None:
        print(f"[server_check] cannot run: --device cuda: {why}")
        print("invariant status: VIOLATED (not checked: see above)")
        return EXIT_USAGE
    model, dummy = TINY, True
    if args.model in REAL_MODELS:
        from tests.sglang_server.models import server_dir

        model, dummy = server_dir(args.model), False
    work = Path(tempfile.mkdtemp(prefix="semgov-vllm-check-"))
    out = Arms()
    t0 = time.monotonic()
    try:
        for arm, connector in (("stock", False), ("semgov", True)):
            cfg = VllmServerConfig(
                model=model, dummy_weights=dummy, connector=connector, kv_cache_gib="2",
                device=args.device, eager=args.eager, max_model_len=max(4096, args.seed_tokens + 256),
                connector_module="tests.vllm.timed_connector",
                hook_env={"VLLM_CPU_NUM_OF_RESERVED_CPU": "1",
                          "SEMGOV_RIG_SCHED_LOG": str(work / arm / "sched_ns.log")},
            )  # fmt: skip
            try:
                run_arm(cfg, arm, work / arm, py, args, out)
            except RigError as e:
                print(f"[server_check] {arm}: could not run: {e}", flush=True)
                print("invariant status: VIOLATED (a server did not start; see above)")
                return EXIT_USAGE
        report(out, args.pairs)
        print_sched(out.sched_ms)
        if args.out is not None:
            save_results(args.out, work, out)
    finally:
        if args.keep:
            print(f"[server_check] scratch kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    realized = sum(out.realized.values())
    summary = (
        f"vLLM, {out.requests} measured requests, {realized} tokens realized, {time.monotonic() - t0:.0f}s"
    )
    return verdict(out.problems, realized, summary)


if __name__ == "__main__":
    sys.exit(main())
