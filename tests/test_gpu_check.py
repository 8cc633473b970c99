"""The prepared GPU check (``benchmarks/gpu_check.sh``): its CPU rehearsal end to end, its table,
its exit status and its time budget."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from tests.sglang_server.scenarios import seed_lengths
from tests.vllm.rig import require_vllm_python

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 1500
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHON": sys.executable, **(env or {})}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=full, capture_output=True, text=True, timeout=timeout
    )


def _servers() -> set[str]:
    """Command lines of running SGLang and vLLM servers (what a stopped piece must not leave)."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return {
        ln
        for ln in out.splitlines()
        if "vllm.entrypoints.openai.api_server" in ln or "sglang.launch_server" in ln
    }


@pytest.mark.sglang_server
def test_the_cpu_rehearsal_runs_both_engines_end_to_end(tmp_path: Path) -> None:
    """--device cpu --small --model tiny: both engines' real servers (dummy weights: 3 minutes on
    2 cores, where SmolLM2's real weights take 14), cohorts and the seed's shape; exit 0, one table
    with every row, realized reuse only where allowed, both engines' scheduler-thread timings."""
    require_vllm_python()
    proc = _run("--device", "cpu", "--small", "--model", "tiny", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    table = (tmp_path / "table.txt").read_text()
    rows = {
        tuple(ln.split()[:2]): ln.split() for ln in table.splitlines() if ln.startswith(("sglang ", "vllm "))
    }
    _, _, e_len, _ = seed_lengths(1000)
    for engine in ("sglang", "vllm"):
        assert rows[(engine, "allowed")][-1] == "512", table
        for cohort in ("other_tenant", "unrelated", "no_context"):
            assert rows[(engine, cohort)][-1] == "0", table
        assert all(cell != "-" for cell in rows[(engine, "allowed")][2:]), table
    assert rows[("sglang", "seed")][-1] == str(e_len), table  # realized in the middle of the prompt
    assert rows[("vllm", "seed")][-1] == "0", table  # vLLM loads only a run continuing its exact hit
    assert table.count(" p99 ") == 2 and "not measured" not in table, table
    assert table.count("invariant status: OK") == 2, table
    assert "gpu check: OK" in proc.stdout


def test_a_piece_that_cannot_run_fails_the_check_and_says_why(tmp_path: Path) -> None:
    """No vLLM environment: the vllm piece exits 2, the table says so, the check exits 2."""
    proc = _run(
        "--device", "cpu", "--engines", "vllm", "--out", str(tmp_path),
        env={"SEMGOV_VLLM_PYTHON": str(tmp_path / "no-such-python")},
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert "no vLLM environment" in proc.stdout
    assert "vllm    exit 2" in proc.stdout and "gpu check: FAILED (exit 2)" in proc.stdout


@pytest.mark.sglang_server
def test_a_piece_past_the_budget_is_stopped_with_its_servers(tmp_path: Path) -> None:
    """--budget-s 15: the SGLang piece is interrupted while its server starts, the check exits 2
    naming the time-out, and no server is left running."""
    before = _servers()
    args = ("--device", "cpu", "--engines", "sglang", "--model", "tiny", "--budget-s", "15")
    proc = _run(*args, "--out", str(tmp_path), timeout=300)
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert "(timed out)" in proc.stdout
    assert _servers() <= before


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engines", "trtllm"], "a comma-separated subset of sglang, vllm"),
        (["--engines", "vllm,vllm"], "a comma-separated subset"),
        (["--pairs", "0"], "--pairs must be at least 1"),
        (["--budget-s", "0"], "--budget-s positive"),
        (["--model", "llama"], "invalid choice"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(args: list[str], message: str) -> None:
    """Bad arguments: exit 2 and a message naming the problem, no piece started."""
    proc = _run(*args, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr and "[gpu_check]" not in proc.stdout


@pytest.mark.sglang_server
def test_cuda_on_a_machine_without_one_is_refused_by_each_piece(tmp_path: Path) -> None:
    """--device cuda where no GPU is seen: each piece says so and exits 2 at once (no server)."""
    require_vllm_python()
    proc = _run("--device", "cuda", "--model", "tiny", "--out", str(tmp_path), timeout=600)
    assert proc.returncode == 2, proc.stdout[-4000:]
    assert "--device cuda: torch sees no CUDA device" in proc.stdout  # the SGLang piece
    assert "--device cuda: vLLM's environment" in proc.stdout and "sees no CUDA device" in proc.stdout
    assert "starting" not in proc.stdout


def test_the_worst_piece_decides_the_exit_status() -> None:
    """A violation (1) outranks could-not-run (2), which outranks nothing-realized (3); unknown is 1."""

    def rc(*codes: int) -> int:
        return gpu_check.verdict([gpu_check.Piece("sglang", c, 0.0) for c in codes])

    assert rc(0, 0) == 0 and rc(0, 3) == 3 and rc(3, 2) == 2 and rc(2, 1) == 1 and rc(0, -9) == 1


def test_rows_come_from_each_checks_results() -> None:
    """The table's rows: SGLang's per-server outcomes and vLLM's per-arm TTFTs, medians and realized."""
    sg = {
        "outcomes": [
            {"server": "page1-overlap", "ttft_ms": {"allowed cold": [10, 30], "allowed warm": [4]},
             "realized_by": {"allowed": 512, "unrelated": 0}},
            {"server": "stock", "ttft_ms": {"allowed cold": [12], "allowed stock": [9]}},
        ]
    }  # fmt: skip
    rows = gpu_check.sglang_rows(sg)
    assert rows["allowed"] == {"cold": 20, "governed": 4, "realized": 512, "stock_cold": 12, "stock": 9}
    assert rows["unrelated"]["realized"] == 0 and "seed" not in rows and "no_context" not in rows
    vl = {"ttft_ms": {"seed/cold-semgov": [50], "seed/semgov": [49]}, "realized": {"seed": 0}}
    assert gpu_check.vllm_rows(vl) == {
        "seed": {"stock_cold": None, "stock": None, "cold": 50, "governed": 49, "realized": 0}
    }
    args = argparse.Namespace(device="cpu", model="smollm2-135m", pairs=1, e_len=512, seed_tokens=1000)
    piece = gpu_check.Piece("vllm", 0, 1.0, "invariant status: OK (x)", gpu_check.vllm_rows(vl))
    text = gpu_check.table([piece], args)
    assert "vllm    seed                 50         -        49        0.98         0" in text
    assert "vllm    not measured" in text
