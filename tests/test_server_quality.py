"""The real-server quality benchmark (benchmarks/server_quality.py): the policies its arms run and
the way it counts; the runs themselves are benchmarks (real weights, minutes per pair)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.server_quality import SIMILARITY_POLICY, problems, shifted_on_policy, summarize_rows
from semgov import Evaluator
from semgov.policy.rego.engines import RegorusEngine
from semgov.policy.rego.loader import load_rego_policy
from tests.conftest import EVIDENCE, QUESTION, SYSTEM, Keys, candidate, gate, parse, request, segs

# NOTE: a new instruction wrapper 10 tokens longer: evidence and question shift by 10
SHIFTED = segs(("system", SYSTEM), ("instruction", list(range(300, 340))), ("evidence", EVIDENCE),
               ("question", QUESTION))  # fmt: skip


def _decide(tmp_path: Path, keys: Keys, pii: Any, source: str, similarity: float = 0.9) -> dict[str, Any]:
    (tmp_path / "policy.rego").write_text(source)
    pol = load_rego_policy(tmp_path)
    ev = Evaluator(pol, keys.keyring, keys.decision, pii_scanner=pii, engine=RegorusEngine(pol))
    req = request([candidate(keys, similarity=similarity)], prompt=SHIFTED)
    return ev.evaluate(parse(req))[0].record


def test_default_denies_a_new_wrapper_on_quality(tmp_path: Path, keys: Keys, pii_scanner: Any) -> None:
    """The governed arm's default policy approves no shifted span: what is left is too little."""
    from benchmarks.server_quality import GOVERNED_POLICY

    rec = _decide(tmp_path, keys, pii_scanner, GOVERNED_POLICY.read_text())
    assert rec["decision"] == "deny" and rec["approved_spans"] == []
    assert "20/380 tokens approved" in gate(rec, "token_verification")["detail"]


@pytest.mark.parametrize(("plan", "head", "tail"), [("", 16, 256), ("trailing:128", 0, 128)])
def test_shifted_on_allows_with_its_plan(
    tmp_path: Path, keys: Keys, pii_scanner: Any, plan: str, head: int, tail: int
) -> None:
    """--shifted-on allows the same candidate with the plan's head recomputed and its tail left out."""
    rec = _decide(tmp_path, keys, pii_scanner, shifted_on_policy(plan))
    assert rec["decision"] == "allow", rec["gates"]
    shifted = [s for s in rec["approved_spans"] if s["kind"] == "shifted"]
    # NOTE: the evidence moved by 10 tokens; the tail ends the span early (computed cold)
    assert [(s["recipient_start"], s["donor_start"]) for s in shifted] == [(60, 50)]
    assert (shifted[0]["length"], shifted[0]["recompute"]) == (len(EVIDENCE) - tail, head)


def test_shifted_on_refuses_a_plan_no_policy_can_sign() -> None:
    """An unknown method is a clear error, not a silently unchanged policy."""
    with pytest.raises(ValueError, match="not a plan"):
        shifted_on_policy("sometimes:3")


@pytest.mark.parametrize(("similarity", "want"), [(0.7, "allow"), (0.5, "deny")])
def test_similarity_only_reuses_whatever_looks_similar(
    tmp_path: Path, keys: Keys, pii_scanner: Any, similarity: float, want: str
) -> None:
    """The similarity-only arm approves every verified span, uncomputed, at similarity >= 0.6."""
    rec = _decide(tmp_path, keys, pii_scanner, SIMILARITY_POLICY.read_text(), similarity)
    assert rec["decision"] == want
    if want == "allow":
        assert rec["approved_spans"] and all(s["recompute"] == 0 for s in rec["approved_spans"])


def _cell(realized: int, changed: bool, lost: list[str], ratio: float | None = 0.4) -> dict[str, Any]:
    return {"ok": True, "error": None, "ttft_ratio": ratio, "changed": changed, "lost": lost,
            "gained": [], "correct": not lost, "realized": realized, "failed": [], "decisions": ["allow"],
            "approved": realized}  # fmt: skip


def _row(pair: str, cohort: str, **arms: dict[str, Any]) -> dict[str, Any]:
    return {"pair": pair, "cohort": cohort, "tokens": 2000, "cold_cold_identical": True,
            "cold": {"ok": True, "ttft_ms": 1000.0, "states_required": True, "error": None},
            "arms": arms}  # fmt: skip


def test_summary_counts_changed_values_apart_from_wording() -> None:
    """Per cohort and arm: changed answers and lost required values counted apart, with intervals."""
    rows = [
        _row("a", "shifted", governed=_cell(1500, False, []), similarity_only=_cell(1900, True, ["9.1%"])),
        _row("b", "shifted", governed=_cell(1500, True, []), similarity_only=_cell(1900, True, [])),
        _row("c", "removed_wrapper", governed=_cell(0, False, [], 1.0)),
    ]
    s = summarize_rows(rows)
    g, sim = s["shifted"]["arms"]["governed"], s["shifted"]["arms"]["similarity_only"]
    assert (g["n"], g["changed"], g["lost"], g["realized_tokens"]) == (2, 1, 0, 3000)
    assert (sim["changed"], sim["lost"], sim["correct"]) == (2, 1, 1)
    assert g["lost_ci95"][0] == 0.0 and 0.5 < g["lost_ci95"][1] < 0.9
    assert g["ttft_ratio_median"] == pytest.approx(0.4)
    both = s["new or removed wrapper"]["arms"]["governed"]
    assert (both["n"], both["realized_pairs"]) == (3, 2)


def test_problems_flag_reuse_where_the_cohort_forbids_it() -> None:
    """A governed realization for a deny cohort, or a decision with no donor in scope, is a problem."""
    rows = [
        _row("d", "instruction", governed=_cell(800, False, [])),
        _row("e", "other_tenant", governed=_cell(0, False, [])),
        _row("f", "shifted", governed=_cell(800, False, [])),
    ]
    out = problems(rows)
    assert len(out) == 2
    assert "realized 800 tokens for a instruction pair" in out[0]
    assert out[1].startswith("e governed: decided")


@pytest.mark.sglang_server
@pytest.mark.model
def test_the_benchmark_runs_end_to_end_in_a_real_sglang_server(tmp_path: Path) -> None:
    """One pair per cohort through a real SGLang server with SmolLM2's real weights: the shifted-on
    governed arm and the similarity arm are realized, deny cohorts are not, the audit log verifies."""
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    args = ["--engine", "sglang", "--model", "smollm2-135m", "--shifted-on", "--pairs", "1"]
    args += ["--other-pairs", "1", "--deny-pairs", "1", "--tokens", "800", "--max-new-tokens", "8"]
    args += ["--floor-pairs", "1", "--warmup", "1", "--out", str(out)]
    run = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "server_quality.py"), *args],
        cwd=root, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads((out / "summary.json").read_text())
    assert doc["problems"] == []
    cohorts = doc["cohorts"]
    assert set(cohorts) >= {"shifted", "removed_wrapper", "exact", "question", "instruction", "other_tenant"}
    wrappers = cohorts["new or removed wrapper"]["arms"]
    assert wrappers["governed"]["n"] == 2 and wrappers["governed"]["realized_pairs"] >= 1
    assert wrappers["similarity_only"]["realized_tokens"] > wrappers["governed"]["realized_tokens"]
    assert cohorts["instruction"]["arms"]["governed"]["realized_tokens"] == 0
    assert cohorts["other_tenant"]["arms"]["governed"]["realized_tokens"] == 0
    assert cohorts["shifted"]["cold_cold"] == {"n": 1, "identical": 1}
    assert (out / "audit").is_dir() and len((out / "pairs.jsonl").read_text().splitlines()) == 8
    assert "SGLang 0.5.23, smollm2-135m" in run.stdout
