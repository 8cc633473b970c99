"""The server check of the semgov SGLang backend, on CPU or on a GPU (``server_check.sh``).

Starts real SGLang servers with ``--radix-cache-backend semgov`` (one per configuration: page
size 1 with overlap scheduling, page size 16 without it, SGLang's retraction test mode, a pool
too small for its traffic, two tensor-parallel ranks where the device has room; chunked prefill
below the prompt length in all), runs the scenarios
of :mod:`tests.sglang_server.scenarios` against each, verifies every audit log with ``semgov
audit verify``, and prints the scenario table, TTFT per cohort and one last line::

    invariant status: OK (...)        or        invariant status: VIOLATED (...)

Exit status: 0 OK; 1 violated (a scenario problem, a dead server, a leak/crash line in a server
log, an audit log that does not verify); 2 could not run (bad arguments, a server that did not
start); 3 invariants held but no allowed pair was realized (reuse not exercised).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from tests.sglang_server import scenarios
from tests.sglang_server.rig import (
    SMOLLM2_ARCH,
    TINY_MODEL,
    RigError,
    Server,
    ServerConfig,
    launch,
    server_configs,
    verify_audit,
)

EXIT_OK, EXIT_VIOLATED, EXIT_USAGE, EXIT_NOT_EXERCISED = 0, 1, 2, 3

Scenario = Callable[[Server, str], scenarios.Outcome]


# Real-weights models a server check can serve (engine_hooks.reference.model, less the tiny ones).
REAL_MODELS = ("smollm2", "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def plan(
    device: str, pairs: int, e_len: int = 2048, seed_tokens: int = 0
) -> list[tuple[str, ServerConfig, list[tuple[str, Scenario]]]]:
    """Servers (:func:`server_configs`) and the scenarios each runs (``seed_tokens``: also the
    seed's shape, on the first server)."""

    def cohorts(s: Server, tag: str) -> scenarios.Outcome:
        return scenarios.cohorts(s, tag, pairs=pairs, e_len=e_len)

    def stock(s: Server, tag: str) -> scenarios.Outcome:
        return scenarios.stock_cohorts(s, tag, pairs=pairs, e_len=e_len)

    def seed(s: Server, tag: str) -> scenarios.Outcome:
        return scenarios.seed_shape(s, tag, tokens=seed_tokens)

    todo: dict[str, list[tuple[str, Scenario]]] = {
        "page1-overlap": [
            ("cohorts", cohorts),
            ("concurrency", scenarios.concurrency),
            ("aborts", scenarios.aborts),
            ("flush", scenarios.flush_under_load),
            ("rids", scenarios.rid_collisions),
            ("hostile", scenarios.hostile_extra_keys),
            ("regions", scenarios.regions),
            *([("seed", seed)] if seed_tokens else []),
        ],
        "page16-no-overlap": [
            ("cohorts", cohorts),
            ("concurrency", scenarios.concurrency),
            ("aborts", scenarios.aborts),
            ("regions", scenarios.regions),
        ],
        "llama3-rope": [("cohorts", cohorts), ("regions", scenarios.regions)],
        "retract": [("retraction", scenarios.retraction)],
        "pressure": [("pressure", scenarios.pressure)],
    }
    if _devices(device) >= 2:  # NOTE: two tensor-parallel ranks (on CPU: one core each)
        todo["tp2"] = [
            ("cohorts", cohorts),
            ("concurrency", scenarios.concurrency),
            ("aborts", scenarios.aborts),
            ("regions", scenarios.regions),
        ]
    configs = server_configs(device)
    out = [(name, configs[name], todo[name]) for name in todo]
    # NOTE: stock SGLang (no semgov backend) runs the same cohorts: the table's "stock" column.
    out.insert(
        1, ("stock", replace(configs["page1-overlap"], backend=None, kv_dump=False), [("cohorts", stock)])
    )
    return out


def _devices(device: str) -> int:
    """How many ranks the device can hold: CPU cores, or CUDA devices."""
    import os

    if device == "cpu":
        return len(os.sched_getaffinity(0))
    import torch

    return int(torch.cuda.device_count())


def preflight(device: str) -> str | None:
    """Why the check cannot run here (None when it can): SGLang, the plugin, the device."""
    import importlib.util
    from importlib.metadata import entry_points

    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed (docs/sglang.md, Install)"
    names = {ep.name for ep in entry_points(group="sglang.srt.plugins")}
    if "semgov" not in names:
        return "the semgov SGLang plugin is not registered: run `pip install -e .` from this checkout"
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "--device cuda: torch sees no CUDA device"
    return None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def sched_stats(path: Path) -> dict[str, float] | None:
    """semgov's scheduler-thread time per request from a rig's ``sched_ns.log`` (first column:
    nanoseconds per finished request): ``n``, ``p50_ms``, ``p99_ms``, ``max_ms`` (nearest rank);
    None when the log is missing or empty."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    ns = sorted(int(ln.split()[0]) for ln in lines if ln.strip())
    if not ns:
        return None

    def rank(q: float) -> float:
        return ns[min(len(ns) - 1, max(0, -(-len(ns) * q // 100) - 1))] / 1e6

    return {"n": len(ns), "p50_ms": rank(50), "p99_ms": rank(99), "max_ms": ns[-1] / 1e6}


def print_sched(sched: dict[str, dict[str, float]]) -> None:
    """The per-server table of semgov's scheduler-thread time per request."""
    if not sched:
        return
    print("\nsemgov's scheduler-thread time per request (K/V copies excluded; nearest rank):")
    print("{:<18} {:>6} {:>9} {:>9} {:>9}".format("server", "n", "p50 ms", "p99 ms", "max ms"))
    for name, st in sched.items():
        print(f"{name:<18} {st['n']:>6.0f} {st['p50_ms']:>9.3f} {st['p99_ms']:>9.3f} {st['max_ms']:>9.3f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="server_check",
        description="Run the semgov SGLang backend in real SGLang servers and check it "
        "(scenarios, SGLang's strict KV-pool checks, the audit log).",
    )
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument(
        "--model",
        choices=("tiny", "smollm2-arch", *REAL_MODELS),
        default="tiny",
        help="tiny: a 2-layer Llama config (dummy weights); smollm2-arch: SmolLM2-135M's architecture "
        "(tests/sglang_server/smollm2_arch, dummy weights); smollm2 (or smollm2-135m), qwen2.5-coder-0.5b, "
        "qwen2.5-coder-1.5b: real weights and tokenizer (converted once from the registry GGUF, cached: "
        "docs/models.md)",
    )
    ap.add_argument(
        "--scenarios", default="", help="comma-separated subset of the scenarios (e.g. cohorts,retraction)"
    )
    ap.add_argument("--pairs", type=int, default=2, help="pairs per cohort (default 2)")
    ap.add_argument("--e-len", type=int, default=2048, help="evidence tokens per cohort pair (default 2048)")
    ap.add_argument(
        "--seed-tokens",
        type=int,
        default=0,
        help="also run the seed's shape on page1-overlap: one recipient of this many tokens, 97%% of "
        "them evidence from a donor behind another wrapper (e.g. 4900; default 0: not run)",
    )
    ap.add_argument("--servers", default="", help="comma-separated subset of the server configurations")
    ap.add_argument("--out", type=Path, default=None, help="copy results, server logs and audit logs here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.e_len < 256:
        ap.error("--pairs must be at least 1 and --e-len at least 256")
    if args.seed_tokens:
        try:
            scenarios.seed_lengths(args.seed_tokens)
        except ValueError as e:
            ap.error(f"--seed-tokens: {e}")
    why = preflight(args.device)
    if why is not None:
        print(f"[server_check] cannot run: {why}")
        print("invariant status: VIOLATED (not checked: see above)")
        return EXIT_USAGE
    dummy = args.model not in REAL_MODELS
    if args.model == "tiny":
        model = TINY_MODEL
    elif args.model == "smollm2-arch":
        model = SMOLLM2_ARCH
    else:
        from tests.sglang_server.models import server_dir

        model = server_dir(args.model)
    # SmolLM2 holds 46 KB of float32 KV per token: size its pools to fit in RAM.
    cap = 131072 if args.model == "tiny" else 32768
    servers = [
        (n, replace(c, model=model, dummy_weights=dummy, max_total_tokens=min(c.max_total_tokens, cap)), s)
        for n, c, s in plan(args.device, args.pairs, args.e_len, args.seed_tokens)
    ]
    if args.scenarios:
        keep = {x.strip() for x in args.scenarios.split(",") if x.strip()}
        known = {name for _, _, todo in servers for name, _ in todo}
        if keep - known:
            ap.error(f"unknown scenario(s) {sorted(keep - known)}; known: {sorted(known)}")
        servers = [(n, c, [t for t in todo if t[0] in keep]) for n, c, todo in servers]
        servers = [x for x in servers if x[2]]
    if args.servers:
        want = {x.strip() for x in args.servers.split(",") if x.strip()}
        unknown = want - {n for n, _, _ in servers}
        if unknown:
            ap.error(
                f"unknown server configuration(s) {sorted(unknown)}; known: {[n for n, _, _ in servers]}"
            )
        servers = [s for s in servers if s[0] in want]

    work = Path(tempfile.mkdtemp(prefix="semgov-server-check-"))
    outcomes: list[tuple[str, scenarios.Outcome]] = []
    sched: dict[str, dict[str, float]] = {}
    problems: list[str] = []
    t0 = time.monotonic()
    try:
        for name, config, todo in servers:
            print(f"[server_check] starting {name} ({' '.join(config.args(0)[2:])})", flush=True)
            try:
                with launch(config, work / name) as srv:
                    print(f"[server_check] {name}: up after {srv.started_s:.0f}s", flush=True)
                    for sname, fn in todo:
                        out = fn(srv, f"{name[:6]}-{sname}")
                        outcomes.append((name, out))
                        mark = "ok" if not out.problems else f"{len(out.problems)} problem(s)"
                        print(f"[server_check] {name}: {out.name}: {mark}", flush=True)
                        problems += [f"{name} {out.name}: {p}" for p in out.problems]
                    alive = srv.alive()
                    bad = srv.fatal_lines()
                files = srv.files
                st = sched_stats(srv.sched_log) if config.backend is not None else None
                if st is not None:
                    sched[name] = st
                if not alive:
                    problems.append(f"{name}: the server died")
                if bad:
                    problems.append(
                        f"{name}: {len(bad)} crash/leak/violation line(s) in the server log: {bad[0]}"
                    )
                why = verify_audit(files) if config.backend is not None else "stock"
                if why == "stock":
                    pass  # NOTE: a stock server (no semgov backend) writes no audit log
                elif why is not None:
                    problems.append(f"{name}: semgov audit verify failed: {why}")
                else:
                    print(f"[server_check] {name}: audit log verifies", flush=True)
            except RigError as e:
                print(f"[server_check] {name}: could not run: {e}", flush=True)
                print("invariant status: VIOLATED (a server did not start; see above)")
                return EXIT_USAGE
        report(outcomes)
        print_sched(sched)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            doc = {
                "outcomes": [{"server": n, **asdict(o)} for n, o in outcomes],
                "sched_ms": sched,
                "problems": problems,
            }
            (args.out / "results.json").write_text(json.dumps(doc, indent=2))
            for name, _, _ in servers:
                for f in ("server.log", "command.txt"):
                    if (work / name / f).exists():
                        shutil.copy(work / name / f, args.out / f"{name}.{f}")
                if (work / name / "hook" / "audit").exists():
                    shutil.copytree(
                        work / name / "hook" / "audit", args.out / f"{name}.audit", dirs_exist_ok=True
                    )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"[server_check] scratch kept: {work}")
    realized = sum(o.realizations for _, o in outcomes)
    decisions = sum(o.decisions for _, o in outcomes)
    requests = sum(o.requests for _, o in outcomes)
    tokens = sum(o.realized_tokens for _, o in outcomes)
    summary = (
        f"{len(outcomes)} scenarios on {len(servers)} servers, {requests} requests, "
        f"{decisions} decisions, {realized} realizations ({tokens} tokens), "
        f"{sum(o.fallbacks for _, o in outcomes)} failed realizations, "
        f"{sum(o.violations for _, o in outcomes)} violations, {time.monotonic() - t0:.0f}s"
    )
    return verdict(problems, realized, summary)


def verdict(problems: Sequence[str], realized: int, summary: str) -> int:
    """Print the problems and the last line (``invariant status: ...``); the exit status."""
    if problems:
        print("\nproblems:")
        for p in problems:
            print(f"  - {p}")
        print(f"invariant status: VIOLATED ({summary})")
        return EXIT_VIOLATED
    if realized == 0:
        print(f"invariant status: OK ({summary}; but no allowed pair was realized: reuse NOT exercised)")
        return EXIT_NOT_EXERCISED
    print(f"invariant status: OK ({summary}; allowed pairs realized, other-tenant/unrelated/no-context cold)")
    return EXIT_OK


def report(outcomes: list[tuple[str, scenarios.Outcome]]) -> None:
    print()
    head = (
        "server",
        "scenario",
        "requests",
        "failed",
        "realized",
        "tokens",
        "fallbacks",
        "violations",
        "problems",
    )
    print("{:<18} {:<34} {:>8} {:>6} {:>8} {:>7} {:>9} {:>10} {:>8}".format(*head))
    for name, o in outcomes:
        cells = (name, o.name, o.requests, o.failed_requests, o.realizations, o.realized_tokens, o.fallbacks,
                 o.violations, len(o.problems))  # fmt: skip
        print("{:<18} {:<34} {:>8} {:>6} {:>8} {:>7} {:>9} {:>10} {:>8}".format(*cells))
    print("(failed: requests that ended without output; aborts end that way by design)")
    print()
    stock = next((o for n, o in outcomes if n == "stock"), None)
    head = ("server", "cohort", "cold ms", "stock ms", "stock/cold", "cold ms", "semgov ms", "semgov/cold")
    print("{:<18} {:<14} {:>8} {:>9} {:>10} | {:>8} {:>9} {:>11}".format(*head))
    for name, o in outcomes:
        if not o.name.startswith("cohorts"):
            continue
        for cohort in scenarios.COHORTS:
            c, w = o.median(f"{cohort} cold"), o.median(f"{cohort} warm")
            sc = stock.median(f"{cohort} cold") if stock is not None else None
            st = stock.median(f"{cohort} stock") if stock is not None else None
            r1 = f"{st / sc:.2f}" if sc and st else "-"
            r2 = f"{w / c:.2f}" if c and w else "-"
            cells = (name, cohort, _fmt(sc), _fmt(st), r1, _fmt(c), _fmt(w), r2)
            print("{:<18} {:<14} {:>8} {:>9} {:>10} | {:>8} {:>9} {:>11}".format(*cells))
    print("(TTFT medians; streamed, time to the first output token. Left: a stock SGLang server (cold")
    print(" arm, warm arm), the same requests with a plain per-scope extra_key; right: this server)")
    for name, o in outcomes:
        for n in o.notes:
            print(f"note: {name} {o.name}: {n}")


if __name__ == "__main__":
    sys.exit(main())
