"""Running the hostile-input campaign: tallies, the three engines, worker processes.

Every (target, engine group) runs in its own worker process (``hostile.py --worker ...``), so
that a native crash (a stack overflow in a parser written in C or Rust) is seen and counted
instead of taking the campaign down, and so that two workers use the two cores. A worker
writes its :class:`Tally` as JSON; the parent merges them.

- ``struct`` workers run the seeds, then the ``random`` engine (a seeded ``random.Random``
  driving the structural mutators), then the ``hypothesis`` engine (the same mutators, every
  choice drawn by Hypothesis from ``st.data()``, fixed ``@seed``, generate phase only).
- ``atheris`` workers run libFuzzer (``atheris.Fuzz``) over the target's seeds as a corpus, with
  a dictionary of the format's tokens, ``-runs=N -seed=S``, coverage-guided by atheris's
  bytecode instrumentation of ``semgov``.
"""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import hostile_targets
from benchmarks.hostile_mutate import HypothesisChooser, RandomChooser
from benchmarks.hostile_targets import TARGETS, Ctx, EntryCrash, HangTimeout, Target, Verdict

KINDS = ("crash", "hang", "allow", "lax", "unlocated", "harness")
MAX_EXAMPLES = 3


@dataclass
class Tally:
    """Counts for one target (merged over engines and workers)."""

    target: str
    inputs: int = 0
    accepted: int = 0
    crashes: int = 0
    hangs: int = 0
    allows: int = 0
    lax: int = 0
    unlocated: int = 0
    harness: int = 0
    seconds: float = 0.0
    max_ms: float = 0.0
    engines: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    kinds: dict[str, Counter[str]] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    examples: dict[str, list[str]] = field(default_factory=dict)  # "kind: what" -> saved files / reprs
    died: list[str] = field(default_factory=list)

    def merge(self, o: Tally) -> None:
        for f in ("inputs", "accepted", "crashes", "hangs", "allows", "lax", "unlocated", "harness"):
            setattr(self, f, getattr(self, f) + getattr(o, f))
        self.seconds += o.seconds
        self.max_ms = max(self.max_ms, o.max_ms)
        self.engines.update(o.engines)
        self.reasons.update(o.reasons)
        for k in KINDS:
            self.kinds[k].update(o.kinds[k])
        for k, ex in o.examples.items():
            mine = self.examples.setdefault(k, [])
            mine += ex[: MAX_EXAMPLES - len(mine)]
        self.died += o.died

    def to_json(self) -> dict[str, Any]:
        # NOTE: not dataclasses.asdict: it rebuilds a Counter from (key, value) pairs, counting the pairs.
        d: dict[str, Any] = {f: getattr(self, f) for f in ("target", "inputs", "accepted", "crashes", "hangs",
                                                         "allows", "lax", "unlocated", "harness", "seconds",
                                                         "max_ms", "examples", "died")}  # fmt: skip
        d["engines"] = dict(self.engines)
        d["reasons"] = dict(self.reasons.most_common(3000))
        d["kinds"] = {k: dict(c) for k, c in self.kinds.items()}
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Tally:
        t = cls(d["target"])
        for f in ("inputs", "accepted", "crashes", "hangs", "allows", "lax", "unlocated", "harness"):
            setattr(t, f, d[f])
        t.seconds, t.max_ms = d["seconds"], d["max_ms"]
        t.engines = Counter(d["engines"])
        t.reasons = Counter(d["reasons"])
        t.kinds = {k: Counter(d["kinds"].get(k, {})) for k in KINDS}
        t.examples = d["examples"]
        t.died = d["died"]
        return t


def _alarm(signum: int, frame: Any) -> None:
    raise HangTimeout()


class Runner:
    """Runs inputs against one target with the hang guard, and tallies the verdicts."""

    def __init__(
        self, target: Target, *, limit_ms: float, save: Path | None, current: Path | None = None,
        stats: Path | None = None,
    ) -> None:  # fmt: skip
        self.target = target
        self.current = current  # the input under test, for the parent if this process gets stuck or dies
        self.stats = stats
        self.limit_s = limit_ms / 1000.0
        self.save = save
        self.tally = Tally(target.name)
        signal.signal(signal.SIGALRM, _alarm)
        target.warm()

    def _example(self, kind: str, what: str, data: bytes) -> None:
        key = f"{kind}: {what}"
        ex = self.tally.examples.setdefault(key, [])
        if len(ex) >= MAX_EXAMPLES:
            return
        if self.save is not None:
            d = self.save / self.target.name
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"{kind}-{hashlib.sha256(data).hexdigest()[:16]}.bin"
            p.write_bytes(data)
            ex.append(str(p))
        else:
            ex.append(repr(data[:160]) + ("..." if len(data) > 160 else ""))

    def run_one(self, data: bytes, engine: str) -> None:
        t = self.tally
        if self.current is not None:
            self.current.write_bytes(data)
        if self.stats is not None and t.inputs % 25 == 0:
            write_stats(t, self.stats)
        t.inputs += 1
        t.engines[engine] += 1
        verdict: Verdict | None = None
        crash = harness = None
        hung = False
        # NOTE: the alarm only interrupts Python code: a C or Rust call that never returns is
        # still a hang, but one that stalls the campaign; the worker's wall-clock timeout catches it.
        signal.setitimer(signal.ITIMER_REAL, max(3 * self.limit_s, 5.0))
        hostile_targets.ENTRY_SECONDS[0] = 0.0
        t0 = time.perf_counter()
        try:
            verdict = self.target.run(data)
        except HangTimeout:
            hung = True
        except EntryCrash as e:
            crash = str(e)
        except Exception as e:  # noqa: BLE001 - a bug in the campaign itself
            tb = traceback.extract_tb(e.__traceback__)[-1]
            harness = f"{type(e).__name__}: {str(e)[:120]} [{Path(tb.filename).name}:{tb.lineno}]"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        t.seconds += time.perf_counter() - t0
        dt = hostile_targets.ENTRY_SECONDS[0]  # semgov's own time on this input
        t.max_ms = max(t.max_ms, dt * 1000)
        if hung or dt > self.limit_s:
            t.hangs += 1
            what = f"over {self.limit_s * 1000:.0f} ms" + (" (interrupted)" if hung else "")
            t.kinds["hang"][what] += 1
            self._example("hang", what, data)
        if crash is not None:
            t.crashes += 1
            t.kinds["crash"][crash] += 1
            self._example("crash", crash, data)
        if harness is not None:
            t.harness += 1
            t.kinds["harness"][harness] += 1
            self._example("harness", harness, data)
        if verdict is None:
            return
        t.accepted += verdict.accepted
        t.reasons.update(set(verdict.reasons))
        for cat, items, counter in (
            ("crash", verdict.crashes, "crashes"),
            ("allow", verdict.allows, "allows"),
            ("lax", verdict.lax, "lax"),
            ("unlocated", verdict.unlocated, "unlocated"),
        ):
            if not items or (cat == "crash" and crash is not None):
                continue
            setattr(t, counter, getattr(t, counter) + 1)
            for what in dict.fromkeys(items):
                t.kinds[cat][what] += 1
                self._example(cat, what, data)


# ---- engines ----------------------------------------------------------------------------------------


def run_struct(runner: Runner, n_random: int, n_hypothesis: int, seed: int, work: Path) -> None:
    """Seeds, then the random engine, then the Hypothesis engine (topped up by random if it stops early)."""
    target = runner.target
    rng = random.Random(seed)
    ch = RandomChooser(rng)
    done = 0
    for s in target.seed_list[:n_random]:
        runner.run_one(s, "seed")
        done += 1
    done += _random(runner, ch, n_random - done)
    if n_hypothesis <= 0:
        return
    ran = run_hypothesis(runner, n_hypothesis, seed, work)
    _random(runner, ch, n_hypothesis - ran)


def _mutate(runner: Runner, ch: Any) -> bytes | None:
    try:
        return runner.target.mutate(ch)
    except Exception as e:  # noqa: BLE001 - a mutator bug: count it, keep going
        if type(e).__name__ in ("StopTest", "Frozen", "UnsatisfiedAssumption"):
            raise  # Hypothesis's own control flow
        tb = traceback.extract_tb(e.__traceback__)[-1]
        runner.tally.harness += 1
        runner.tally.kinds["harness"][
            f"mutate: {type(e).__name__}: {str(e)[:100]} [{Path(tb.filename).name}:{tb.lineno}]"
        ] += 1
        return None


def _random(runner: Runner, ch: RandomChooser, n: int) -> int:
    done = tries = 0
    while done < n and tries < 3 * n + 10:
        tries += 1
        data = _mutate(runner, ch)
        if data is not None:
            runner.run_one(data, "random")
            done += 1
    return done


def run_hypothesis(runner: Runner, n: int, seed: int, work: Path) -> int:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.configuration import set_hypothesis_home_dir

    set_hypothesis_home_dir(str(work / "hypothesis-home"))
    count = [0]

    @hseed(seed)
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(st.data())
    def drive(data: Any) -> None:
        if count[0] >= n:
            return
        payload = _mutate(runner, HypothesisChooser(data))
        if payload is None:
            return
        count[0] += 1
        runner.run_one(payload, "hypothesis")

    try:
        drive()
    finally:
        set_hypothesis_home_dir(None)  # back to the default (tests in the same process use it)
    return count[0]


def dict_file(tokens: list[bytes], path: Path) -> Path:
    def esc(b: bytes) -> str:
        return "".join(chr(c) if 0x20 <= c < 0x7F and c not in (0x22, 0x5C) else f"\\x{c:02x}" for c in b)

    path.write_text("".join(f'kw{i}="{esc(t)}"\n' for i, t in enumerate(tokens) if t))
    return path


def _artifact_dir(d: Path) -> Path:
    """libFuzzer refuses to start when its artifact directory does not exist: create it."""
    d.mkdir(parents=True, exist_ok=True)
    return d


def atheris_worker(target: Target, runner: Runner, runs: int, seed: int, work: Path, stats: Path) -> None:
    """libFuzzer over the target's seeds; writes the tally every 25 inputs and at the last one."""
    import atheris

    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for s in target.seed_list:
        (corpus / hashlib.sha256(s).hexdigest()[:16]).write_bytes(s)
    max_len = max([target.max_len, *(len(s) + 4096 for s in target.seed_list)])
    args = [
        sys.argv[0],
        f"-runs={runs}",
        f"-seed={seed}",
        f"-max_len={max_len}",
        "-len_control=0",
        "-reload=0",  # no timed corpus reloads: they would make the run depend on the clock
        "-timeout=0",
        "-rss_limit_mb=6144",
        "-print_final_stats=1",
        f"-dict={dict_file(target.dictionary(), work / 'fuzz.dict')}",
        f"-artifact_prefix={_artifact_dir(runner.save or work)}/{target.name}-",
        str(corpus),
    ]

    def one(data: bytes) -> None:
        runner.run_one(bytes(data), "atheris")
        if runner.tally.inputs >= runs:
            write_stats(runner.tally, stats)

    atheris.Setup(args, one)
    atheris.Fuzz()


def write_stats(t: Tally, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(t.to_json()))
    tmp.replace(path)


# ---- the parent: planning jobs, running workers ---------------------------------------------------------


@dataclass
class Job:
    target: str
    engine: str  # "struct" | "atheris"
    n_random: int
    n_hypothesis: int
    n_atheris: int
    seed: int

    @property
    def n(self) -> int:
        return self.n_random + self.n_hypothesis + self.n_atheris


def derive_seed(seed: int, *parts: str) -> int:
    h = hashlib.sha256(f"{seed}:{':'.join(parts)}".encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF


def plan(budget: int, seed: int, names: list[str], *, atheris: bool, shares: dict[str, float]) -> list[Job]:
    """Split the budget over targets (by share) and engines: random 45%, hypothesis 20%, atheris 35%."""
    total = sum(shares[n] for n in names)
    alloc = {n: int(budget * shares[n] / total) for n in names}
    left = budget - sum(alloc.values())
    for n in sorted(names, key=lambda n: -shares[n])[:left]:
        alloc[n] += 1
    jobs = []
    for n in names:
        k = alloc[n]
        a = int(k * 0.35) if atheris else 0
        h = int(k * 0.20)
        r = k - a - h
        jobs.append(Job(n, "struct", r, h, 0, derive_seed(seed, n, "struct")))
        if a:
            jobs.append(Job(n, "atheris", 0, 0, a, derive_seed(seed, n, "atheris")))
    return jobs


def worker_main(args: Any) -> int:
    """Entry of a worker process (``hostile.py --worker``)."""
    work = Path(args.work)
    job = Job(**json.loads(args.job))
    stats = Path(args.stats)
    if job.engine == "atheris":
        import atheris

        # Coverage: every semgov module this target can reach (the context parser included),
        # instrumented before first import.
        with atheris.instrument_imports(include=["semgov"]):
            _import_semgov()
    ctx = Ctx(work / "scratch", engine=args.engine)
    target = TARGETS[job.target](ctx)
    runner = Runner(
        target, limit_ms=args.time_limit_ms, save=Path(args.save) if args.save else None,
        current=work / "current.bin", stats=stats,
    )  # fmt: skip
    if job.engine == "atheris":
        atheris_worker(target, runner, job.n_atheris, job.seed, work, stats)
    else:
        run_struct(runner, job.n_random, job.n_hypothesis, job.seed, work)
    write_stats(runner.tally, stats)
    return 0


def _import_semgov() -> None:
    import semgov.audit.merkle
    import semgov.audit.note
    import semgov.audit.store
    import semgov.audit.verify
    import semgov.audit.verify_dir
    import semgov.context  # noqa: F401
    import semgov.decide
    import semgov.facts.compute
    import semgov.intake.capture
    import semgov.policy.rego.engines
    import semgov.policy.rego.loader
    import semgov.policy.source
    import semgov.policy.testing
    import semgov.policy.yaml.engine  # noqa: F401


def run_jobs(
    jobs: list[Job], *, script: Path, work: Path, parallel: int, limit_ms: float, engine: str,
    save: Path | None, progress: Any = None,
) -> dict[str, Tally]:  # fmt: skip
    """Run every job in a worker process, ``parallel`` at a time; merge the tallies by target."""
    tallies: dict[str, Tally] = {}
    pending = sorted(jobs, key=lambda j: -_cost(j))  # longest first: better packing on two cores
    running: list[tuple[Job, subprocess.Popen[bytes], Path, float, Path]] = []
    while pending or running:
        while pending and len(running) < parallel:
            job = pending.pop(0)
            jdir = work / f"{job.target}-{job.engine}"
            jdir.mkdir(parents=True, exist_ok=True)
            stats = jdir / "stats.json"
            logf = jdir / "worker.log"
            cmd = [
                sys.executable, str(script), "--worker", "--job", json.dumps(asdict(job)),
                "--work", str(jdir),
                "--stats", str(stats), "--time-limit-ms", str(limit_ms), "--engine", engine,
            ]  # fmt: skip
            if save is not None:
                cmd += ["--save", str(save)]
            with open(logf, "wb") as lf:
                proc = subprocess.Popen(cmd, stdout=lf, stderr=subprocess.STDOUT, env=_worker_env())
            running.append((job, proc, stats, time.monotonic(), logf))
        time.sleep(0.05)
        for item in list(running):
            job, proc, stats, started, logf = item
            # A worker stuck in native code (where the alarm cannot reach) for far longer than its
            # inputs can take: killed, and its current input counted as a hang.
            limit = 120 + job.n * max(limit_ms / 1000.0, 0.05)
            killed = False
            if proc.poll() is None and time.monotonic() - started > limit:
                proc.kill()
                proc.wait()
                killed = True
            if proc.poll() is None:
                continue
            running.remove(item)
            t = Tally.from_json(json.loads(stats.read_text())) if stats.exists() else Tally(job.target)
            if proc.returncode != 0 or t.inputs < job.n:
                tail = logf.read_bytes()[-1500:].decode("utf-8", "replace").strip()[-600:]
                t.died.append(f"{job.engine} worker exited with {proc.returncode} after {t.inputs}/{job.n} "
                              f"inputs; log tail: {tail}")  # fmt: skip
                if proc.returncode != 0:
                    # The input it was on when it died or got stuck counts, as a hang or a crash.
                    t.inputs += 1
                    kind, what = ("hang", "worker stuck in native code, killed") if killed else (
                        "crash", f"worker process died ({proc.returncode})")  # fmt: skip
                    if kind == "hang":
                        t.hangs += 1
                    else:
                        t.crashes += 1
                    t.kinds[kind][what] += 1
                    cur = stats.parent / "current.bin"
                    if cur.exists():
                        data = cur.read_bytes()
                        ex = repr(data[:160])
                        if save is not None:
                            (save / job.target).mkdir(parents=True, exist_ok=True)
                            p = save / job.target / f"{kind}-{hashlib.sha256(data).hexdigest()[:16]}.bin"
                            p.write_bytes(data)
                            ex = str(p)
                        t.examples.setdefault(f"{kind}: {what}", []).append(ex)
            tallies.setdefault(job.target, Tally(job.target)).merge(t)
            if progress is not None:
                progress(job, t, time.monotonic() - started)
    return tallies


def _cost(j: Job) -> float:
    per = {"rego_policy": 30.0, "audit_log": 12.0, "captured": 3.0, "provenance": 3.0, "yaml_policy": 3.0}
    return j.n * per.get(j.target, 1.0) + (50 if j.engine == "atheris" else 0)


def _worker_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONHASHSEED"] = "0"  # set iteration order is part of what libFuzzer's coverage sees
    return env
