"""The gateway latency benchmark's smoke mode runs end to end (a refactor cannot silently break it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gateway_latency_smoke(tmp_path: Path) -> None:
    """`benchmarks/gateway_latency.py --smoke` measures both arms and the gateway's steps."""
    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gateway_latency.py", "--smoke", "--json", str(out)],
        capture_output=True, text=True, cwd=str(ROOT), timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["n"] == 20 and r["engine"] == "stub"
    for arm in ("direct_ms", "gateway_ms"):
        assert 0 < r[arm]["p50"] <= r[arm]["p99"]
    assert {"parse", "render", "tokenize_cold", "tokenize_warm", "mint", "prepare_cold"} <= set(r["steps_ms"])
    assert r["prompt_tokens"]["min"] >= 400
