"""Start-up time of the command line, as a ratio to a bare Python start, measured in one run.

Usage: python benchmarks/cli_startup.py [--n 20] [--smoke]

Each command is run ``--n`` times as a fresh process, interleaved with the baseline
``python -c 'import argparse'`` (the floor: the interpreter and argparse, nothing of semgov).
Reports the median and min wall time of each, and each command's median as a ratio to the
baseline's median (the target for ``--version`` and ``--help``: at most 4x). Commands: the
installed ``semgov`` script (``python -m semgov.cli.main`` without one) with ``--version``,
``--help``, ``audit show`` and ``audit stats`` on a 200-record audit log made here, and
``policy check policies/default`` (a command that loads a policy, for comparison).
``--smoke``: each command once, without the file-cache warm-up pass (seconds; the figures mean
nothing).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_log(directory: Path) -> Path:
    """A 200-record audit log of small signed engine events."""
    from datetime import UTC, datetime

    from semgov.audit.store import AuditLog
    from semgov.signing.engine_events import engine_event, sign_engine_event
    from semgov.signing.keys import generate_keypair, load_signing_key

    priv, _ = generate_keypair(directory / "keys")
    key = load_signing_key(priv)
    audit = directory / "audit"
    with AuditLog.open(audit, signing_key=key, origin="bench") as log:
        for i in range(200):
            ev = engine_event("realization", engine="bench", at=datetime.now(UTC), request_id=f"r-{i}")
            log.append(sign_engine_event(ev, key).canonical)
    return audit


def wall(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=ROOT)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20, help="runs of each command (default 20)")
    ap.add_argument("--smoke", action="store_true", help="each command once, no warm-up: in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.n = 1
    script = shutil.which("semgov")
    semgov = [script] if script else [sys.executable, "-m", "semgov.cli.main"]
    with tempfile.TemporaryDirectory(prefix="semgov-startup-") as tmp:
        audit = make_log(Path(tmp))
        runs: dict[str, list[str]] = {
            "python -c 'import argparse'": [sys.executable, "-c", "import argparse"],
            "semgov --version": [*semgov, "--version"],
            "semgov --help": [*semgov, "--help"],
            "semgov audit show (200 records)": [*semgov, "audit", "show", str(audit)],
            "semgov audit stats (200 records)": [*semgov, "audit", "stats", str(audit)],
            "semgov policy check policies/default": [*semgov, "policy", "check", "policies/default"],
        }
        times: dict[str, list[float]] = {k: [] for k in runs}
        for cmd in runs.values() if not args.smoke else ():
            wall(cmd)  # warm the file cache
        for _ in range(args.n):
            for name, cmd in runs.items():
                times[name].append(wall(cmd))
    base = statistics.median(times["python -c 'import argparse'"])
    print(f"n={args.n} runs each, interleaved; {' '.join(semgov)}")
    print(f"{'command':<40}{'median ms':>10}{'min ms':>9}{'x baseline':>12}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<40}{med * 1e3:>10.1f}{min(ts) * 1e3:>9.1f}{med / base:>12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
