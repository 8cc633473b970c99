"""``server_check.sh --engine``: picks the SGLang or the vLLM check, and refuses anything else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "engine_hooks" / "sglang" / "server_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def test_engine_vllm_runs_the_vllm_check() -> None:
    """--engine vllm (either spelling) reaches the vLLM check, whose --help names its options."""
    for args in (("--engine", "vllm", "--help"), ("--engine=vllm", "--help")):
        proc = _run(*args)
        assert (
            proc.returncode == 0 and "server_check --engine vllm" in proc.stdout and "--eager" in proc.stdout
        )


def test_engine_sglang_is_the_default() -> None:
    """Without --engine, or with --engine sglang, the SGLang check answers (its own --help)."""
    for args in (("--help",), ("--engine", "sglang", "--help")):
        proc = _run(*args)
        assert proc.returncode == 0 and "--servers" in proc.stdout and "--eager" not in proc.stdout


def test_an_unknown_engine_is_refused() -> None:
    """--engine foo, or --engine with no value: exit 2 and a message naming the choices."""
    proc = _run("--engine", "foo")
    assert proc.returncode == 2 and "expected sglang or vllm" in proc.stderr
    assert _run("--engine").returncode == 2
