"""`semgov bench` (engine_hooks.reference.bench): end to end on the tiny model, the CLI, the workload.

The real-model run (`semgov bench --quick`) is the acceptance run, not a unit test.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.reference.bench import summary
from engine_hooks.reference.bench_workload import (
    COHORTS,
    BenchKeys,
    WorkloadBuilder,
    expected,
    numbers_in,
    value_present,
)
from semgov import Evaluator
from semgov.cli.main import main
from semgov.stats import wilson
from tests.conftest import DEFAULT_POLICY_DIR

ARMS = ("exact_only", "similarity_only", "governed")
ALLOW = {c for c in COHORTS if expected(c) == "allow"}


@pytest.fixture(scope="module")
def bench_out(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench")
    argv = ["bench", "--quick", "--model", "tiny", "--out", str(out), "--prefix-tokens", "300"]
    rc = main([*argv, "--max-new-tokens", "6", "--repeats", "1", "--threads", "1"])
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    return out, rc, results


def test_bench_tiny_writes_results_with_required_keys(bench_out: tuple[Path, int, dict[str, Any]]) -> None:
    """A tiny-model quick run exits 0 and results.json holds every arm's required figures per cohort."""
    _, rc, results = bench_out
    assert rc == 0
    assert set(results["arms"]) == set(ARMS)
    for arm in ARMS:
        s = results["arms"][arm]
        for key in (
            "pairs",
            "unsafe_materializations",
            "quality_regressions",
            "materialized_tokens",
            "cohorts",
        ):
            assert key in s, (arm, key)
        assert s["pairs"] == len(COHORTS)
        assert set(s["cohorts"]) == set(COHORTS)
        for c in s["cohorts"].values():
            assert c["n"] == 1 and c["median_ttft_ratio"] > 0
    for key in ("prefix_measurement", "governance_overhead", "noise_floor", "environment", "pairs"):
        assert key in results
    assert results["environment"]["model"].startswith("tiny-llama")
    assert results["noise_floor"]["n"] == 2
    assert results["tokenization_consistent"] is True


def test_bench_governed_arm_is_safe_and_reuses_for_allow_cohorts(
    bench_out: tuple[Path, int, dict[str, Any]],
) -> None:
    """Governed: no materialization for any deny-expected pair, engine-confirmed reuse for every allow one."""
    _, _, results = bench_out
    assert results["arms"]["governed"]["unsafe_materializations"] == 0
    for row in results["pairs"]:
        g = row["arms"]["governed"]
        assert g["action"] == row["expect"], row["pair"]
        if row["expect"] == "allow":
            assert g["materialized_tokens"] > 0 and g["realization_events"] == 1, row["pair"]
        else:
            assert g["materialized_tokens"] == 0 and g["realization_events"] == 0, row["pair"]


def test_bench_ungoverned_arms_reuse_for_deny_expected_pairs(
    bench_out: tuple[Path, int, dict[str, Any]],
) -> None:
    """similarity_only copies KV into deny-expected pairs (e.g. a new response contract)."""
    _, _, results = bench_out
    sim = results["arms"]["similarity_only"]
    assert sim["unsafe_materializations"] > 0
    assert sim["cohorts"]["instruction"]["materialized_tokens"] > 0
    assert sim["cohorts"]["unrelated"]["materialized_tokens"] == 0  # below the similarity minimum
    assert results["arms"]["exact_only"]["cohorts"]["exact"]["materialized_tokens"] > 0


def test_bench_writes_report_and_plots(bench_out: tuple[Path, int, dict[str, Any]]) -> None:
    """report.md has the per-arm and per-cohort tables with n; both plots are PNG files."""
    out, _, results = bench_out
    report = (out / "report.md").read_text()
    assert "## Per arm" in report and "## Per cohort, arms side by side" in report
    assert "## Noise floor" in report and "## Governance overhead" in report
    for c in COHORTS:
        assert re.search(rf"^\| {c} \| (allow|deny) \| 1 \|", report, re.M), c
    assert f"(n={len(COHORTS)})" in report
    assert len((out / "pairs.jsonl").read_text().splitlines()) == len(COHORTS)
    for name in ("ttft_by_cohort.png", "quality_by_arm.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert name in results["plots"]


def test_regressions_carry_their_interval_in_results_report_and_summary(
    bench_out: tuple[Path, int, dict[str, Any]],
) -> None:
    """Each cohort's regression count has its 95% Wilson interval in results.json, report and summary."""
    out, _, results = bench_out
    for arm in ARMS:
        s = results["arms"][arm]
        assert s["quality_regression_ci95"] == list(wilson(s["quality_regressions"], s["pairs"]))
        for c in s["cohorts"].values():
            lo, hi = c["quality_regression_ci95"]
            assert 0 <= lo <= c["quality_regressions"] / c["n"] <= hi <= 1
    report = (out / "report.md").read_text()
    assert "| cohort | n | cold states the known value | exact_only | similarity_only | governed |" in report
    for arm in ARMS:
        s = results["arms"][arm]
        assert s["values_lost_ci95"] == list(wilson(s["values_lost"], s["pairs"]))
        assert s["wording_only"] == sum(
            1
            for r in results["pairs"]
            if not r["arms"][arm]["greedy_agree"] and not r["arms"][arm]["values_lost"]
        )
    text = summary(results)
    assert (
        "similarity / governed, 95% intervals: changed answers; changed required values (known value lost)"
        in text
    )
    assert "known value lost [95%]" in text and "model limit: " in text
    assert "cold/cold floor: 2 of 2 reruns gave the same answer, bit-identical" in text
    assert results["noise_floor"]["bit_identical"] is True


def test_answers_are_compared_by_their_response_contract(bench_out: tuple[Path, int, dict[str, Any]]) -> None:
    """Each arm's answer is compared by its contract; cohort and arm figures count them, with intervals."""
    out, _, results = bench_out
    assert results["contracts"]["source"].endswith("bench_contracts.yaml")
    assert any(
        e.startswith("financials (any revision): required_values") for e in results["contracts"]["entries"]
    )
    for r in results["pairs"]:
        assert r["contract_spec"].startswith(r["response_contract"]["id"])
        for arm in ARMS:
            c = r["arms"][arm]["contract"]
            assert c["answer_changed"] == (not r["arms"][arm]["greedy_agree"]), (r["pair"], arm)
            assert c["regressed"] == c["values_changed"] and (not c["values_changed"] or c["answer_changed"])
    for arm in ARMS:
        for cohort, s in [("all", results["arms"][arm]), *results["arms"][arm]["cohorts"].items()]:
            rows = [r for r in results["pairs"] if cohort in ("all", r["cohort"])]
            values = sum(1 for r in rows if r["arms"][arm]["contract"]["values_changed"])
            answers = sum(1 for r in rows if r["arms"][arm]["contract"]["answer_changed"])
            assert (s["changed_required_values"], s["changed_answers"]) == (values, answers), (arm, cohort)
            assert s["changed_required_values_ci95"] == list(wilson(values, len(rows)))
            assert s["changed_answers_ci95"] == list(wilson(answers, len(rows)))
    report = (out / "report.md").read_text()
    assert "| changed answers [95%] | changed required values [95%] | known value lost [95%] |" in report
    assert "- Response contracts: `" in report
    assert "changed answers [95%]" in summary(results)


def test_the_shipped_contracts_match_every_known_value_the_workload_asks_for() -> None:
    """The shipped contracts name each pair's known value: dropping its evidence sentence loses it."""
    from engine_hooks.reference.bench import DEFAULT_CONTRACTS
    from semgov.contracts import load_contracts

    contracts = load_contracts(DEFAULT_CONTRACTS)
    assert {e.id for e in contracts.entries} == {"financials", "risk_summary"}
    builder = WorkloadBuilder(_toy_tokenize, 300, BenchKeys.generate())
    for pair in builder.pairs(3):
        spec = contracts.spec(pair.request.response_contract.model_dump())
        assert spec.compare == "required_values" and spec.patterns, pair.pair_id
        (value,) = pair.required
        sentence = next(s for s in pair.recipient.text.split(". ") if value in s)  # as the evidence says it
        lost = spec.compare_answers(sentence, "It was not stated.").lost
        assert any(v.split("=", 1)[1].startswith(value) for v in lost), (pair.pair_id, sentence, lost)


def test_bench_takes_a_contracts_file_and_checks_it_before_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--contracts reaches the run (default: the shipped file); a bad file stops it before the model loads."""
    import engine_hooks.reference.bench as harness
    from semgov.errors import InputError

    bad = tmp_path / "contracts.yaml"
    bad.write_text("version: 1\ncontracts:\n  - id: financials\n    compare: required_values\n")
    t0 = time.perf_counter()
    assert (
        main(["bench", "--quick", "--model", "tiny", "--out", str(tmp_path / "o"), "--contracts", str(bad)])
        == 2
    )
    assert time.perf_counter() - t0 < 60
    assert f"{bad}:3: compare: required_values takes exactly one of" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.json").exists()
    seen: list[Path] = []

    def record(cfg: Any, **_: Any) -> Any:
        seen.append(cfg.contracts)
        raise InputError("stopped here")

    monkeypatch.setattr(harness, "run_bench", record)
    for extra in ([], ["--contracts", str(tmp_path / "mine.yaml")]):
        assert main(["bench", "--quick", "--out", str(tmp_path / "o"), *extra]) == 2
    assert seen == [harness.DEFAULT_CONTRACTS, tmp_path / "mine.yaml"]


def test_the_wheel_ships_the_default_contracts_beside_the_harness(tmp_path: Path) -> None:
    """A built wheel carries engine_hooks/reference/bench_contracts.yaml (bench's --contracts default)."""
    import subprocess
    import sys
    import zipfile

    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(root),
         "-w", str(tmp_path)],
        check=True, capture_output=True, timeout=600, cwd=str(tmp_path),
    )  # fmt: skip
    (wheel,) = tmp_path.glob("semgov-*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = z.read("engine_hooks/reference/bench_contracts.yaml")
    assert shipped == (root / "engine_hooks" / "reference" / "bench_contracts.yaml").read_bytes()


def test_wilson_interval_is_the_textbook_one() -> None:
    """Wilson 95%: 0 of 30 is at most 11.4%, 3 of 10 is 10.8-60.3%; n = 0 says nothing (0-100%)."""
    assert [round(x, 3) for x in wilson(0, 30)] == [0.0, 0.114]
    assert [round(x, 3) for x in wilson(3, 10)] == [0.108, 0.603]
    assert wilson(0, 0) == (0.0, 1.0) and wilson(5, 5)[1] == 1.0


def test_bench_help(capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov bench --help` documents the options."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--quick", "--out", "--tokens", "--pairs-per-cohort", "--model", "--threads"):
        assert opt in out


def test_bench_without_model_extras_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without torch the command exits 2 naming the model extra."""
    real = importlib.import_module

    def fake(name: str, package: str | None = None) -> Any:
        if name == "engine_hooks.reference.bench":
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", fake)
    assert main(["bench", "--quick", "--out", str(tmp_path)]) == 2
    assert "pip install -e '.[model]'" in capsys.readouterr().err


_WORD = re.compile(r"<\|[a-z_]+\|>|\w+|[^\w\s]|\s+")


def _toy_tokenize(text: str) -> list[int]:
    """Words, punctuation, whitespace runs and ChatML markers to stable ids (concatenation-safe here)."""
    return [
        int.from_bytes(hashlib.sha256(p.encode()).digest()[:4], "big") % 49152 for p in _WORD.findall(text)
    ]


def test_workload_decisions_match_the_cohort_design() -> None:
    """Every cohort's pair gets the decision its design expects from the default policy."""
    keys = BenchKeys.generate()
    builder = WorkloadBuilder(_toy_tokenize, 300, keys)
    ev = Evaluator(__import__("semgov").load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision)
    for pair in builder.pairs(2):
        assert ev.evaluate(pair.request)[0].decision == pair.expect, pair.pair_id
        assert pair.required and all(v in pair.recipient.text for v in pair.required)


def test_value_present_compares_numbers() -> None:
    """A required value counts when its number appears in the answer, thousands separators aside."""
    assert numbers_in("$4,182.7 million, up 6.1%") == ["4182.7", "6.1"]
    assert value_present("$4,182.7 million", "Revenue was 4182.7 million dollars.")
    assert value_present("13%", "It was 13 percent.")
    assert not value_present("$4,182.7 million", "Revenue was $4,182 million.")
    assert not value_present("13%", "It was 113%.")


def test_the_cli_knows_every_model_the_reference_engine_loads() -> None:
    """`--model` choices (parsed without torch) are exactly the reference engine's model names."""
    from engine_hooks.reference.model import MODEL_CHOICES as ENGINE
    from semgov.cli.bench import MODEL_CHOICES as CLI

    assert sorted(CLI) == sorted(ENGINE)


def test_bench_runs_on_the_qwen2_architecture(tmp_path: Path) -> None:
    """A quick run on tiny-qwen2 (q/k/v biases, untied head): the governed arm is safe and reuses."""
    argv = ["bench", "--quick", "--model", "tiny-qwen2", "--out", str(tmp_path), "--prefix-tokens", "300"]
    assert main([*argv, "--max-new-tokens", "4", "--repeats", "1", "--threads", "1"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["environment"]["model"].startswith("tiny-qwen2")
    gov = results["arms"]["governed"]
    assert gov["unsafe_materializations"] == 0
    assert gov["cohorts"]["question"]["materialized_tokens"] > 0
    assert gov["cohorts"]["removed_wrapper"]["materialized_tokens"] == 0  # shifted spans: off by default
    assert results["arms"]["similarity_only"]["cohorts"]["removed_wrapper"]["materialized_tokens"] > 0
