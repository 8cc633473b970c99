"""Every benchmark script's ``--smoke`` runs end to end and prints (or writes) its figures.

Nothing ran the benchmarks, so a refactor could break one unnoticed (``decision_latency.py --burst``
imported a function that had gone). Each script runs here as a subprocess, as a person runs it,
with ``--smoke``: tiny sizes, seconds. Only that the figures are there is checked, never their
values (speed is measured in benchmarks/README.md, not asserted in tests). What each smoke run
leaves out (servers, real weights, the PII scan) is listed in benchmarks/README.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

BENCH = ROOT / "benchmarks"

# NOTE: smoke runs that live with their own tests, not duplicated here
ELSEWHERE = {
    "calibration_loop.py": "tests/sglang_server/test_calibrate_server.py (a real server)",
    "gateway_latency.py": "tests/gateway/test_benchmark.py",
    "gpu_check.py": "tests/test_gpu_check.py (its CPU rehearsal)",
    "hostile.py": "tests/test_hostile.py",
}
# NOTE: modules the scripts import (covered by their smoke runs); hostile_semantic.py also runs alone
HELPERS = {
    "_machine.py",
    "_smoke.py",
    "_workloads.py",
    "hostile_mutate.py",
    "hostile_oracle.py",
    "hostile_run.py",
    "hostile_semantic.py",
    "hostile_targets.py",
    "hostile_vllm.py",
}


@dataclass(frozen=True)
class Smoke:
    """One smoke run: the script, its arguments (``{tmp}``: a fresh directory) and what it must show."""

    script: str
    args: tuple[str, ...]
    check: Callable[[str, Path], None]


def _lines(pattern: str, n: int = 1) -> Callable[[str, Path], None]:
    """At least ``n`` output lines match ``pattern``."""

    def check(out: str, tmp: Path) -> None:
        found = re.findall(pattern, out, re.M)
        assert len(found) >= n, f"{len(found)} lines match {pattern!r}, want {n}:\n{out[-3000:]}"

    return check


def _all(*checks: Callable[[str, Path], None]) -> Callable[[str, Path], None]:
    """Every one of ``checks``."""

    def check(out: str, tmp: Path) -> None:
        for c in checks:
            c(out, tmp)

    return check


def _json(name: str, test: Callable[[Any], bool]) -> Callable[[str, Path], None]:
    """The script wrote ``tmp/name`` as JSON, and ``test`` holds of it."""

    def check(out: str, tmp: Path) -> None:
        doc = json.loads((tmp / name).read_text())
        assert test(doc), json.dumps(doc)[:3000]

    return check


US = r"\s+\d+"  # a figure column
BASELINE = _lines(r"^machine baseline: fsync .* load average [\d.]+ on \d+ cores$", 2)
COHORTS = "exact|question_variant|shifted|unrelated|other_tenant|tampered"
LATENCY = _all(_lines(rf"^\s+512 ({COHORTS})\s+(allow|deny){US * 4}", 6), _lines(r"^worst p99: \d+ us"))
ENGINES = r"yaml|regorus|opa-inprocess|opa-server \(HTTP\)|opa-server \(HTTP, bulk\)"
STAGES = "exact|first|poll|match|realize|copy|sched|decided"
CASES = "exact|shifted wrapper|question variant|interleaved 4 blocks|unrelated|one repeated token"

SMOKES = [
    Smoke(
        "audit_append.py",
        ("--dir", "{tmp}"),
        _all(BASELINE, _lines(r"^commit_interval=.* (saturated|paced) .* rec/s", 4)),
    ),
    Smoke("audit_proofs.py", (), _lines(r"^(inclusion|consistency) proof, .* verify \d+ us", 6)),
    Smoke(
        "audit_report.py",
        ("--dir", "{tmp}/log"),
        _all(BASELINE, _lines(r"^audit report: [\d.]+ s wall, exit 0, peak RSS")),
    ),
    Smoke(
        "audit_verify.py",
        ("--dir", "{tmp}/log"),
        _all(BASELINE, _lines(r"^verify_log: 300 records, .* -> OK$"), _lines(r"^proof bundle for record 0")),
    ),
    Smoke(
        "audit_fleet_verify.py",
        ("--dir", "{tmp}/fleet"),
        _all(
            BASELINE,
            _lines(r"^verify_fleet: 2 logs, 600 records, 600 signatures, .* -> OK$"),
            _lines(r"^semgov audit verify DIR \(fleet of 2\): [\d.]+ s wall, exit 0$"),
        ),
    ),
    Smoke("check_throughput.py", (), _lines(r"^(text removed|in-process).*\s[\d.]+\s+\d+\s+\d+$", 3)),
    Smoke("cli_startup.py", (), _lines(r"^semgov .*\s[\d.]+\s+[\d.]+\s+[\d.]+$", 5)),
    Smoke("decision_latency.py", (), LATENCY),
    Smoke(
        "decision_latency.py",
        ("--hook", "--hot", "--breakdown"),
        _all(LATENCY, _lines(r"^\s+mean us: prompt_of \d+, .*policy engine \d+", 6)),
    ),
    Smoke("decision_latency.py", ("--burst",), _all(LATENCY, _lines(r"burst: back to back"))),
    Smoke("engine_latency.py", (), _lines(rf"^({ENGINES}){US * 4}$", 5)),
    Smoke(
        "first_decision.py",
        ("--json", "{tmp}/r.json"),
        _json("r.json", lambda rows: len(rows) == 2 and all(r["first_outcomes"] for r in rows)),
    ),
    Smoke(
        "hook_overhead.py",
        (),
        _all(
            _lines(rf"^\s+400 ({STAGES}){US * 3}$", 8),
            _lines(r"^\s+400 per-(real|round)\s", 2),
            _lines(r"us\s+sum; "),
        ),
    ),
    Smoke(
        "materialize.py",
        (),
        _all(_lines(r"^\s+25[67]\s+\d+\s+[\d.]+", 2), _lines(r"^re-rotated, recompute 100%\s+0\.0", 2)),
    ),
    Smoke(
        "metrics_overhead.py",
        (),
        _all(BASELINE, _lines(r"^(in memory|exported).* decision [\d.]+ / [\d.]+", 2)),
    ),
    Smoke(
        "policy_lifecycle.py",
        (),
        _all(
            BASELINE,
            _lines(r"^(plain|capture|shadow|both)\s+[\d.]+", 4),
            _lines(r"^reload end to end .* n=3$"),
        ),
    ),
    Smoke(
        "fleet_reuse.py",
        ("--out", "{tmp}/fleet.json"),
        _all(
            _lines(r"^(1 worker|2 workers, .*)\s+4\s+\d/4\s+\d+\s+\d+\s+\d+%", 3),
            _json("fleet.json", lambda d: [c["colocated"] for c in d["cells"]][::2] == [4, 4]),
        ),
    ),
    Smoke("provider_latency.py", (), _lines(rf"^\s+512\s+12{US * 4}\s+[\d.]+$")),
    Smoke(
        "realization_quality.py",
        ("--out", "{tmp}"),
        _json("summary.json", lambda d: {"none", "trailing:64", "selective:20%"} <= set(d["methods"])),
    ),
    Smoke(
        "server_quality.py",
        ("--out", "{tmp}"),
        _json("summary.json", lambda d: d["smoke"] and not d["problems"] and "other_tenant" in d["cohorts"]),
    ),
    Smoke(
        "side_channel.py",
        ("--out", "{tmp}/sc.json"),
        _json("sc.json", lambda d: len(d["results"]) == 10 and d["caller_view"]["clean_after"] is not None),
    ),
    Smoke(
        "sglang_itl.py",
        (),
        _all(_lines(r"^(stock|semgov)\s+[\d.]+", 2), _lines(r"^burst ITL semgov/stock: p50 [\d.]+x")),
    ),
    Smoke(
        "sglang_server.py",
        (),
        _all(
            _lines(r"^(new_wrapper|instruction_variant|dropped_instruction) .* 128\s+128\s+100%$", 3),
            _lines(r"^checks: all met$"),
        ),
    ),
    Smoke(
        "sglang_soak.py",
        ("--out", "{tmp}/soak.json"),
        _json("soak.json", lambda d: d["requests"] == 40 and d["realizations"] > 0 and not d["problems"]),
    ),
    Smoke(
        "token_adversarial.py",
        ("--json", "{tmp}/t.json"),
        _all(
            _json("t.json", lambda d: len(d["rows"]) == 14), _lines(r"^blocks_seps\s+1024\s+\d+\s+[\d.]+ m?s")
        ),
    ),
    Smoke("token_verification.py", (), _lines(rf"^({CASES})\s+\d+\s+\d+", 6)),
]


def test_every_script_has_a_smoke_run() -> None:
    """Every script in benchmarks/ has --smoke run here or by its own tests; the rest are helpers."""
    scripts = {p.name for p in BENCH.glob("*.py")} - HELPERS
    here = {s.script for s in SMOKES}
    assert scripts == here | set(ELSEWHERE), (scripts - here - set(ELSEWHERE), here - scripts)
    assert not here & set(ELSEWHERE)
    for name in scripts - {"gpu_check.py"}:  # NOTE: gpu_check.sh's smoke is its CPU rehearsal
        assert '"--smoke"' in (BENCH / name).read_text(), name


@pytest.mark.parametrize("smoke", SMOKES, ids=lambda s: " ".join((s.script, *s.args[:1])).strip())
def test_smoke_run_prints_its_figures(smoke: Smoke, tmp_path: Path) -> None:
    """The script's --smoke exits 0 and prints (or writes) every figure it measures."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in smoke.args]
    proc = subprocess.run(
        [sys.executable, str(BENCH / smoke.script), "--smoke", *args],
        capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    smoke.check(proc.stdout, tmp_path)
