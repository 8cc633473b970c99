"""`semgov check` throughput, end to end, pinned to one core.

Usage: python benchmarks/check_throughput.py [--workload FILE] [--repeat 3] [--smoke]

Runs the real command (`python -m semgov.cli.main check ... --format jsonl`,
records to /dev/null) under `taskset -c 0` on:
  1. the workload as captured (donor text present: each distinct donor text is
     scanned by Presidio once, the scan cache being per process);
  2. the same workload with every `text` field removed (no Presidio scan: the
     governance cost alone: parsing, facts, ten gates, signing, output);
  3. in-process, one long-lived Evaluator (as in a serving hook): a first pass
     (each donor scanned once) and a second pass over the same requests (scan
     and signature caches warm), parsing included, output not written.
Reports wall time (best of --repeat, process start included), candidates/s and
requests/s. Target: >= 2,000 candidates/s on one core.

``--smoke``: the first 30 requests of the workload with their text removed, one run each: the
command end to end and the in-process passes in seconds, but not the "as captured" row, nor any
Presidio scan (its load alone takes about 10 s); the figures mean nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"


def _strip_text(src: Path, dst: Path) -> tuple[int, int]:
    reqs = cands = 0
    with gzip.open(src, "rt") as f, open(dst, "w") as out:
        for line in f:
            r = json.loads(line)
            r["prompt"].pop("text", None)
            for c in r["candidates"]:
                c["prompt"].pop("text", None)
            reqs += 1
            cands += len(r["candidates"])
            out.write(json.dumps(r, separators=(",", ":")) + "\n")
    return reqs, cands


def time_check(path: Path, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` runs of ``semgov check`` on ``path`` (process start included),
    pinned to core 0 with the example keys and the default policy, sorted."""
    taskset = shutil.which("taskset")
    cmd = [
        *([taskset, "-c", "0"] if taskset else []),
        sys.executable, "-m", "semgov.cli.main", "check", str(path),
        "--policy", str(ROOT / "policies" / "default"), "--trust", str(EX / "keyring.json"),
        "--signing-key", str(EX / "keys" / "decision-signing-key.pem"), "--format", "jsonl",
    ]  # fmt: skip
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
        out.append(time.perf_counter() - t)
    return sorted(out)


def _run(path: Path, repeat: int) -> float:
    return time_check(path, repeat)[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", type=Path, default=EX / "captured.jsonl.gz")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="30 requests, no text, one run: in seconds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.repeat, args.workload = 1, _head(args.workload, Path(tmp) / "smoke.jsonl.gz", 30)
        plain = Path(tmp) / "no-text.jsonl"
        reqs, cands = _strip_text(args.workload, plain)
        print(
            f"workload {args.workload.name}: {reqs} requests, {cands} candidates; "
            f"1 core; best of {args.repeat}"
        )
        print(f"{'variant':<34}{'wall s':>8}{'cand/s':>9}{'req/s':>8}")
        variants = [
            ("as captured (Presidio, per donor)", args.workload),
            ("text removed (no Presidio)", plain),
        ]
        for name, path in variants[1:] if args.smoke else variants:  # NOTE: smoke: no text to scan
            wall = _run(path, args.repeat)
            print(f"{name:<34}{wall:>8.2f}{cands / wall:>9.0f}{reqs / wall:>8.0f}")
        for name, wall in _in_process(args.workload):
            print(f"{name:<34}{wall:>8.2f}{cands / wall:>9.0f}{reqs / wall:>8.0f}")
    return 0


def _head(src: Path, dst: Path, n: int) -> Path:
    """``--smoke``'s workload: the first ``n`` requests of ``src``, text removed (no Presidio scan)."""
    with gzip.open(src, "rt") as f, gzip.open(dst, "wt") as out:
        for _, line in zip(range(n), f, strict=False):
            r = json.loads(line)
            for p in (r["prompt"], *(c["prompt"] for c in r["candidates"])):
                p.pop("text", None)
            out.write(json.dumps(r, separators=(",", ":")) + "\n")
    return dst


def _in_process(workload: Path) -> list[tuple[str, float]]:
    from semgov import CapturedRequest, Evaluator, Keyring, load_policy, load_signing_key

    os.sched_setaffinity(0, {0})
    ev = Evaluator(
        load_policy(ROOT / "policies" / "default"),
        Keyring.load(EX / "keyring.json"),
        load_signing_key(EX / "keys" / "decision-signing-key.pem"),
    )
    with gzip.open(workload, "rb") as f:
        lines = f.read().splitlines()
    out = []
    for name in ("in-process, first pass", "in-process, caches warm"):
        t = time.perf_counter()
        for line in lines:
            ev.evaluate(CapturedRequest.model_validate_json(line))
        out.append((name, time.perf_counter() - t))
    scanner = ev.ctx.pii_scanner
    print(f"(Presidio scans in the in-process run: {scanner.scans if scanner else 0})")
    return out


if __name__ == "__main__":
    sys.exit(main())
