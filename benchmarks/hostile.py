"""The hostile-input campaign: fuzz every semgov parser and entry point, judge every outcome.

Usage: python benchmarks/hostile.py [--budget 100000] [--seed 20261129] [--targets a,b,...]
       [--time-limit-ms 2000] [--engine auto|yaml|regorus] [--jobs 2] [--save DIR]
       [--semantic N [--semantic-only]] [--smoke]

``--smoke``: ``--budget 400 --targets checkpoint,rego_policy`` (every engine, its workers, the
table and the last line, in seconds; the other targets are not run, and 400 inputs find little).

``--semantic N`` adds the semantic mode (``benchmarks/hostile_semantic.py``): N well-formed,
validly signed inputs whose meaning differs from what was signed (task pairs that join alike,
relabelled segments, swapped or unsigned text, times 1 ns past a boundary, ...), each of which
must be denied by the YAML engine and regorus.

Targets (``benchmarks/hostile_targets.py``; share of the budget in brackets):

- ``captured`` [20%]: captured-request lines through ``read_captured`` and the evaluator, as
  ``semgov check`` runs them;
- ``provenance`` [14%]: the same entry point, mutating candidates' signed provenance (payloads,
  signatures, key ids; re-signed by trusted, revoked, rogue and unknown keys);
- ``records`` [8%]: decision records and engine events (``semgov verify-decision``,
  ``verify_engine_event``, the audit verifier's per-leaf check);
- ``keyring`` [7%]: keyring files (``Keyring.load``);
- ``yaml_policy`` [12%]: ``policy.yaml`` files (``load_policy_source``, then a decision);
- ``rego_policy`` [3%]: ``.rego`` modules (``load_policy_source``, then decisions by regorus);
- ``policy_input`` [12%]: policy input documents (semgov's document validation, then the YAML
  engine and regorus through ``Evaluator.decide``);
- ``audit_log`` [6%]: audit log directories (``verify_log``, ``AuditLog.open`` + append + close);
- ``checkpoint`` [7%]: signed checkpoint notes (``open_checkpoint``);
- ``bundle`` [7%]: proof bundles (``semgov audit verify-proof``'s read and ``verify_bundle``);
- ``context`` [4%]: gateway context tokens in the SGLang hook's ``extra_key``
  (``parse_context_token`` with the request's ``lora_id``, then ``scope`` / ``cache_key`` and
  ``anonymous_cache_key`` with its ``cache_salt``): re-MACed adversarial payloads, wrong keys,
  MAC surgery, non-ASCII and lone surrogates anywhere, LoRA suffix mismatches, non-str values.

Engines (``benchmarks/hostile_run.py``), per target: about 45% ``random`` (the seeds themselves,
then a seeded ``random.Random`` driving structure-aware mutators: field deletion and duplication,
duplicate JSON keys, type swaps, boundary numbers, NaN/Infinity literals, unicode confusables,
controls and lone surrogates, huge strings, deep nesting, re-signing with the wrong keys, line
and token surgery on YAML, Rego and notes, byte damage), 20% ``hypothesis`` (the same
mutators with every choice drawn by Hypothesis from ``st.data()``, fixed seed, generate phase
only) and 35% ``atheris`` (libFuzzer byte mutation over the seeds as a corpus, with a per-format
dictionary, coverage-guided by atheris's instrumentation of ``semgov`` and the hook's context
parser, ``-runs=N -seed=S``).
Without atheris installed its share goes to ``random``. The table says how many inputs each
engine produced.

The run is reproducible: every input follows from ``--seed`` (fixtures are built with fixed
ids; Hypothesis and libFuzzer are seeded; workers run with ``PYTHONHASHSEED=0``). Only the
hang column depends on the machine.

A **crash** is an exception semgov does not document for the entry point, an error that does
not name its file, or a deny without a named reason; a **hang** is an input on which semgov
itself (not the oracle) spends more than ``--time-limit-ms`` (a SIGALRM guard interrupts one at
3x the limit; a worker stuck in native code is killed and its input counted as a hang); an
**allow of malformed input** is an allow, load or verification of an input the independent
oracle (``benchmarks/hostile_oracle.py``) judges malformed or tampered.
``lax`` counts accepted format deviations that change no signed or proved content (e.g.
non-canonical base64 with the same bytes), ``unlocated`` policy errors without a line; neither
is in the last line. ``accept``: inputs accepted (allowed, loaded, verified); ``reasons``:
distinct rejection reasons seen (numbers and quoted values blanked); ``in/s``: inputs per second
of worker time (semgov and oracle); ``max ms``: semgov's time on the slowest input. Every
finding's input is written under ``--save DIR``. Exit status 1 when c, h or a is not 0 (3 on an
error in the campaign itself).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_SEED = 20261129


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=int, default=100_000, metavar="N", help="total inputs (default 100000)")
    p.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, metavar="S", help=f"campaign seed ({DEFAULT_SEED})"
    )
    p.add_argument("--targets", metavar="A,B", help="comma-separated targets (default: all)")
    p.add_argument(
        "--time-limit-ms", type=float, default=2000.0, metavar="MS", help="hang threshold per input"
    )
    p.add_argument("--engine", choices=("auto", "yaml", "regorus"), default="auto",
                   help="policy engine for the captured-request targets (default: yaml)")  # fmt: skip
    p.add_argument("--jobs", type=int, default=2, metavar="J", help="worker processes at once (default 2)")
    p.add_argument("--no-atheris", action="store_true", help="give atheris's share to the random engine")
    p.add_argument("--save", type=Path, metavar="DIR", help="write every finding's input under DIR")
    p.add_argument("--verbose", action="store_true", help="list every kind of finding and lax accept")
    p.add_argument("--semantic", type=int, default=0, metavar="N",
                   help="also run N inputs of the semantic mode (benchmarks/hostile_semantic.py): "
                        "well-formed, validly signed inputs whose meaning differs from what was signed; "
                        "each must be denied")  # fmt: skip
    p.add_argument("--semantic-only", action="store_true", help="run only the semantic mode (--semantic N)")
    p.add_argument("--smoke", action="store_true", help="--budget 400 --targets checkpoint,rego_policy")
    # Internal: one worker process.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--stats", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.budget, args.targets = 400, "checkpoint,rego_policy"
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from benchmarks import hostile_run as hr

    if args.worker:
        return hr.worker_main(args)
    semantic = 0
    if args.semantic:
        from benchmarks.hostile_semantic import run as run_semantic

        semantic = run_semantic(args.semantic, args.seed)
        if args.semantic_only or semantic == 3:
            return semantic
    from benchmarks.hostile_targets import TARGETS

    names = list(TARGETS) if not args.targets else [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        print(f"unknown target(s) {unknown}; choose from {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    atheris = not args.no_atheris and _have_atheris()
    shares = {n: TARGETS[n].share for n in names}
    jobs = hr.plan(args.budget, args.seed, names, atheris=atheris, shares=shares)
    jobs = [j for j in jobs if j.n > 0]
    print(f"hostile campaign: budget {args.budget}, seed {args.seed}, {len(names)} targets, "
          f"engines random/hypothesis{'/atheris' if atheris else ''} (atheris {'on' if atheris else 'off'}), "
          f"hang threshold {args.time_limit_ms:.0f} ms, {args.jobs} workers", flush=True)  # fmt: skip
    work = Path(
        tempfile.mkdtemp(prefix="semgov-hostile-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
    )
    t0 = time.monotonic()

    def progress(job: hr.Job, t: hr.Tally, secs: float) -> None:
        print(f"  done {job.target:<13} {job.engine:<8} {t.inputs:>6} inputs in {secs:6.1f} s "
              f"(c {t.crashes}, h {t.hangs}, a {t.allows})", flush=True)  # fmt: skip

    try:
        tallies = hr.run_jobs(
            jobs, script=Path(__file__).resolve(), work=work, parallel=max(1, args.jobs),
            limit_ms=args.time_limit_ms, engine=args.engine, save=args.save, progress=progress,
        )  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - t0
    return max(report([tallies[n] for n in names if n in tallies], wall, verbose=args.verbose), semantic)


def _have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def report(tallies: list, wall: float, *, verbose: bool = False) -> int:  # type: ignore[type-arg]
    from benchmarks.hostile_run import Tally

    total = Tally("total")
    for t in tallies:
        total.merge(t)
    w = sys.stdout.write
    w(f"\n{'target':<13}{'inputs':>8}{'random':>8}{'hypo':>7}{'athrs':>7}{'crash':>7}{'hang':>6}{'allow':>7}"
      f"{'lax':>6}{'unloc':>6}{'accept':>8}{'reasons':>8}{'in/s':>7}{'max ms':>8}\n")  # fmt: skip
    for t in [*tallies, total]:
        if t is total:
            w("-" * 106 + "\n")
        e = t.engines
        rate = t.inputs / t.seconds if t.seconds else 0.0
        w(f"{t.target:<13}{t.inputs:>8}{e['random'] + e['seed']:>8}{e['hypothesis']:>7}{e['atheris']:>7}"
          f"{t.crashes:>7}{t.hangs:>6}{t.allows:>7}{t.lax:>6}{t.unlocated:>6}{t.accepted:>8}{len(t.reasons):>8}"
          f"{rate:>7.0f}{t.max_ms:>8.0f}\n")  # fmt: skip
    n = total.inputs
    w(f"\nengines: random {total.engines['random'] + total.engines['seed']} "
      f"({100 * (total.engines['random'] + total.engines['seed']) / max(n, 1):.0f}%, of which seeds "
      f"{total.engines['seed']}), hypothesis {total.engines['hypothesis']} "
      f"({100 * total.engines['hypothesis'] / max(n, 1):.0f}%), atheris {total.engines['atheris']} "
      f"({100 * total.engines['atheris'] / max(n, 1):.0f}%); wall time {wall:.0f} s\n")  # fmt: skip
    for t in tallies:
        shown = False
        for cat in ("crash", "hang", "allow", "harness", "lax", "unlocated"):
            kinds = t.kinds[cat]
            if not kinds or (cat in ("lax", "unlocated") and not verbose and len(kinds) > 6):
                kinds = kinds if cat not in ("lax", "unlocated") else type(kinds)(dict(kinds.most_common(6)))
            for what, count in kinds.most_common():
                if not shown:
                    w(f"\n{t.target}:\n")
                    shown = True
                ex = t.examples.get(f"{cat}: {what}", [])
                w(f"  {cat:<9} {count:>6}  {what}\n")
                if ex and cat in ("crash", "hang", "allow", "harness"):
                    w(f"  {'':<9} {'':>6}  e.g. {ex[0]}\n")
        for d in t.died:
            if not shown:
                w(f"\n{t.target}:\n")
                shown = True
            w(f"  worker    {d}\n")
    if total.harness:
        w(f"\ncampaign errors (bugs in the campaign, not in semgov): {total.harness}\n")
    w(f"\nhostile: {n} inputs, {total.crashes} crashes, {total.hangs} hangs, "
      f"{total.allows} allows of malformed input\n")  # fmt: skip
    if total.harness:
        return 3
    return 1 if (total.crashes or total.hangs or total.allows) else 0


if __name__ == "__main__":
    sys.exit(main())
