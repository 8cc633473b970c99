"""semgov calibrate: regression rates with intervals per scope, and the policy overlay they write."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from semgov import CapturedRequest, Evaluator, Keyring, load_signing_key
from semgov.cli.main import main
from semgov.errors import PolicyError
from semgov.policy.calibration import ScopeResult, Trial, aggregate, overlay_rego, overlay_yaml
from semgov.policy.rego.engines import OpaInProcessEngine, RegorusEngine
from semgov.policy.rego.loader import load_rego_policy
from semgov.policy.yaml.model import load_policy, parse_policy
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

EX = ROOT / "examples"
REGO = ROOT / "policies" / "rego" / "default"


def _trials(scope: tuple[str, str], kind: str, method: str, n: int, bad: int) -> list[Trial]:
    return [Trial(scope[0], scope[1], kind, method, i < bad) for i in range(n)]  # type: ignore[arg-type]


M = ["trailing:128", "leading:20%", "bookend:16+256"]


def test_the_first_method_whose_upper_bound_fits_the_budget_is_kept() -> None:
    """Per scope, methods are judged by the 95% upper bound, in the order given: 0/20 (16%) fits 0.2,
    1/20 (25%) does not; the rule turns shifted reuse on with the method's plan, or off."""
    a, b = ("qa", "c1"), ("sum", "c2")
    trials = [
        *_trials(a, "shifted", M[0], 20, 1),
        *_trials(a, "shifted", M[1], 20, 0),
        *_trials(a, "shifted", M[2], 20, 0),
        *_trials(b, "shifted", M[0], 20, 3),
        *_trials(b, "shifted", M[2], 20, 1),
        *_trials(b, "prefix", "as approved", 7, 0),
    ]
    ra, rb = aggregate(trials, M, 0.2)
    assert (ra.task, ra.chosen, rb.task, rb.chosen) == ("qa", "leading:20%", "sum", None)
    assert ra.rule() == {"task": "qa", "response_contract": "c1", "allow_shifted": True,
                         "shifted_recompute_percent": 20, "min_recompute_tokens": 0,
                         "shifted_recompute_tail_tokens": 0}  # fmt: skip
    assert rb.rule() == {"task": "sum", "response_contract": "c2", "allow_shifted": False}
    assert rb.prefix.n == 7 and round(ra.shifted[M[1]].ci95[1], 3) == 0.161
    only_prefix = aggregate(_trials(a, "prefix", "as approved", 5, 0), M, 0.2)[0]
    assert only_prefix.rule() is None  # nothing shifted was measured: no rule, the policy decides
    with pytest.raises(ValueError, match="budget"):
        aggregate(trials, M, 1.5)
    with pytest.raises(ValueError, match="not a plan a policy can sign"):
        aggregate(trials, ["selective:20%"], 0.2)


def test_methods_become_the_policy_settings_that_plan_them() -> None:
    """Each method a policy can sign maps to its quality settings (head percent, head tokens, tail)."""
    from semgov.policy.calibration import plan_settings

    def p(m: str) -> tuple[int, int, int]:
        s = plan_settings(m)
        return s["shifted_recompute_percent"], s["min_recompute_tokens"], s["shifted_recompute_tail_tokens"]

    assert p("none") == (0, 0, 0) and p("leading:20%") == (20, 0, 0) and p("boundary:16") == (0, 16, 0)
    assert p("trailing:256") == (0, 0, 256) and p("bookend:16+128") == (0, 16, 128)
    for bad in ("trailing:20%", "selective:20%", "leading:150%"):
        with pytest.raises(ValueError):
            plan_settings(bad)


def _results() -> list[ScopeResult]:
    return aggregate(
        [
            *_trials(("extract_financials", "financials"), "shifted", "trailing:256", 20, 5),
            *_trials(("summarize_risks", "risk_summary"), "shifted", "trailing:256", 20, 0),
        ],
        ["trailing:256"],
        0.2,
    )


def test_the_yaml_overlay_puts_calibrated_rules_first_and_keeps_the_rest() -> None:
    """Calibrated rules come first; a base rule of another scope stays, one of the same scope is replaced."""
    base = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
    base = base.replace(
        "  rules: []",
        "  rules:\n"
        "    - {task: extract_financials, response_contract: financials, shifted_recompute_percent: 9}\n"
        "    - {task: qa, min_recompute_tokens: 64}",
    )
    out = overlay_yaml(base.encode(), "base.yaml", _results(), "calibrated\non a test")
    assert out.startswith(b"# calibrated\n# on a test\n")
    p = parse_policy(out, "x")
    assert [r.model_dump(exclude_none=True) for r in p.quality.rules] == [
        {"task": "extract_financials", "response_contract": "financials", "allow_shifted": False},
        {
            "task": "summarize_risks",
            "response_contract": "risk_summary",
            "allow_shifted": True,
            "shifted_recompute_percent": 0,
            "min_recompute_tokens": 0,
            "shifted_recompute_tail_tokens": 256,
        },
        {"task": "qa", "min_recompute_tokens": 64},
    ]
    assert p.name == "default" and p.tenant == load_policy(DEFAULT_POLICY_DIR).tenant
    with pytest.raises(PolicyError):
        overlay_yaml(b"name: [", "broken.yaml", _results(), "x")


def test_the_rego_overlay_replaces_the_quality_rules_line_or_says_why_not() -> None:
    """The one-line quality_rules parameter gets the rules; a module without it is a PolicyError naming it."""
    text = (REGO / "policy.rego").read_text()
    out = overlay_rego(text, "policy.rego", _results())
    line = next(x for x in out.splitlines() if x.startswith("quality_rules := "))
    assert json.loads(line.removeprefix("quality_rules := "))[0] == {
        "task": "extract_financials",
        "response_contract": "financials",
        "allow_shifted": False,
    }
    assert out.replace(line, "quality_rules := []") == text
    with pytest.raises(PolicyError, match="quality_rules") as e:
        overlay_rego("package semgov.reuse\n", "mine.rego", _results())
    assert e.value.source == "mine.rego"


def _small_capture(tmp: Path, n: int) -> Path:
    out = tmp / "captured.jsonl"
    with gzip.open(EX / "captured.jsonl.gz", "rt") as f, out.open("w") as g:
        for _, line in zip(range(n), f, strict=False):
            g.write(line)
    return out


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("calibrate")
    cap = _small_capture(tmp, 300)
    out = tmp / "out"
    args = ["calibrate", str(cap), "--policy", str(DEFAULT_POLICY_DIR), "--trust", str(EX / "keyring.json")]
    args += ["--out", str(out), "--rego", str(REGO), "--model", "tiny", "--sample", "2"]
    args += ["--methods", "trailing:64,leading:50%"]
    assert main(args) == 0
    return out, cap


def test_calibrate_says_what_it_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The last line names the policy file and calibration.json where they are; the table heads the output."""
    cap = _small_capture(tmp_path, 40)
    out = tmp_path / "o"
    args = ["calibrate", str(cap), "--policy", str(DEFAULT_POLICY_DIR), "--trust", str(EX / "keyring.json")]
    assert main([*args, "--out", str(out), "--model", "tiny", "--sample", "1", "--percents", "20"]) == 0
    assert json.loads((out / "calibration.json").read_text())["methods"] == ["leading:20%"]
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[0].startswith("task ")
        and lines[-1] == f"wrote {out / 'yaml' / 'policy.yaml'} and {out / 'calibration.json'}"
    )
    assert (out / "yaml" / "policy.yaml").is_file() and not (out / "rego").exists()


def test_calibrate_writes_policies_that_policy_check_accepts(calibrated: tuple[Path, Path]) -> None:
    """The command writes yaml/ and rego/ policies (policy check exits 0) and calibration.json's counts."""
    out, _ = calibrated
    assert main(["policy", "check", str(out / "yaml")]) == 0
    assert main(["policy", "check", str(out / "rego")]) == 0
    report = json.loads((out / "calibration.json").read_text())
    assert report["requests"] == 300 and report["sampled"] > 0
    assert report["methods"] == ["trailing:64", "leading:50%"]
    shifted = [s for s in report["scopes"] if s["shifted"]]
    # NOTE: the default policy turns shifted spans off; calibration tries them anyway
    assert shifted and all(set(s["shifted"]) == {"trailing:64", "leading:50%"} for s in shifted)
    for s in shifted:
        assert s["rule"]["task"] == s["task"] and all(c["n"] >= 1 for c in s["shifted"].values())
    rules = [r.model_dump(exclude_none=True) for r in load_policy(out / "yaml").quality.rules]
    assert rules == [s["rule"] for s in report["scopes"] if s["rule"]]


def test_the_calibrated_yaml_and_rego_decide_alike(calibrated: tuple[Path, Path]) -> None:
    """Every candidate of the calibration's capture: the same decisions and plans from YAML, regorus, OPA."""
    out, cap = calibrated
    kr = Keyring.load(EX / "keyring.json")
    sk = load_signing_key(EX / "keys" / "decision-signing-key.pem")
    rego = load_rego_policy(out / "rego")
    evs = (
        Evaluator(load_policy(out / "yaml"), kr, sk),
        Evaluator(rego, kr, sk, engine=RegorusEngine(rego)),
        Evaluator(rego, kr, sk, engine=OpaInProcessEngine(rego)),
    )
    seen = 0
    for line in cap.read_text().splitlines():
        req = CapturedRequest.model_validate_json(line)
        for docs in zip(*(ev.policy_inputs(req) for ev in evs), strict=True):
            got = [ev.decide(doc) for ev, doc in zip(evs, docs, strict=True)]
            keys = [([(g.gate, g.result) for g in r.gates], r.approved_spans) for r in got]
            assert keys[0] == keys[1] == keys[2]
            seen += 1
    assert seen > 300


@pytest.mark.parametrize(
    ("flag", "value", "needle"),
    [
        ("--percents", "5,101", "0 to 100"),
        ("--methods", "selective:20%", "not a plan a policy can sign"),
        ("--budget", "1.5", "from 0 to 1"),
        ("--sample", "0", "at least 1"),
    ],
)
def test_bad_calibration_arguments_are_usage_errors(
    flag: str, value: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Out-of-range percents, budget or sample size exit 2 with a message naming the flag."""
    args = ["calibrate", "x.jsonl", "--policy", "p", "--trust", "k", "--out", "o", flag, value]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and needle in err


def test_a_policy_that_forbids_shifted_reuse_everywhere_has_nothing_to_calibrate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """token_verification.allow_shifted false is the ceiling no rule can lift: exit 2 naming the file."""
    pol = tmp_path / "p"
    pol.mkdir()
    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
    (pol / "policy.yaml").write_text(text.replace("  allow_shifted: true\n", "  allow_shifted: false\n", 1))
    cap = _small_capture(tmp_path, 5)
    args = ["calibrate", str(cap), "--policy", str(pol), "--trust", str(EX / "keyring.json")]
    assert main([*args, "--out", str(tmp_path / "o"), "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "policy.yaml" in err and "nothing to calibrate" in err


def test_trial_sources_decide_alike_with_the_plan_and_a_revision_that_names_it() -> None:
    """The calibration trial of the default policy, YAML and Rego, approves shifted spans with the
    plan's head and tail, decides alike in both languages, and records the live revision plus the plan."""
    from semgov.policy.calibration import trial_source

    kr = Keyring.load(EX / "keyring.json")
    sk = load_signing_key(EX / "keys" / "decision-signing-key.pem")
    yaml_live, rego_live = load_policy(DEFAULT_POLICY_DIR), load_rego_policy(REGO)
    yaml_t, rego_t = trial_source(yaml_live, "bookend:16+256"), trial_source(rego_live, "bookend:16+256")
    assert yaml_t.revision == f"{yaml_live.revision}+calibrate:bookend:16+256"
    assert rego_t.revision == f"{rego_live.revision}+calibrate:bookend:16+256"
    assert (yaml_t.name, yaml_t.version, rego_t.name, rego_t.version) == ("default", "1", "default", "1")
    evs = (Evaluator(yaml_t, kr, sk), Evaluator(rego_t, kr, sk, engine=RegorusEngine(rego_t)))
    live = Evaluator(yaml_live, kr, sk)
    shifted = 0
    with gzip.open(EX / "captured.jsonl.gz", "rt") as f:
        for line in list(f)[:400]:
            req = CapturedRequest.model_validate_json(line)
            for docs in zip(*(ev.policy_inputs(req) for ev in evs), live.policy_inputs(req), strict=True):
                a, b = (ev.decide(doc) for ev, doc in zip(evs, docs[:2], strict=True))
                assert [(g.gate, g.result) for g in a.gates] == [(g.gate, g.result) for g in b.gates]
                assert a.approved_spans == b.approved_spans
                for s in a.approved_spans:
                    if s.kind == "shifted":
                        shifted += 1
                        assert s.recompute == min(s.length, 16)
                off = live.decide(docs[2])
                assert not any(s.kind == "shifted" for s in off.approved_spans)  # off in the live one
    assert shifted >= 10
    assert rego_live.modules != rego_t.modules and yaml_live.quality.rules == []


def test_a_trial_of_a_policy_that_forbids_shifted_reuse_is_refused() -> None:
    """token_verification.allow_shifted false: no calibration trial can exist (PolicyError says why)."""
    from semgov.policy.calibration import trial_source

    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
    p = parse_policy(
        text.replace("  allow_shifted: true\n", "  allow_shifted: false\n", 1).encode(), "p.yaml"
    )
    with pytest.raises(PolicyError, match="nothing to calibrate"):
        trial_source(p, "none")
    with pytest.raises(ValueError, match="not a plan a policy can sign"):
        trial_source(load_policy(DEFAULT_POLICY_DIR), "selective:20%")


def test_vllm_is_refused_saying_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--engine vllm exits 2 before anything runs, naming what vLLM cannot realize."""
    args = [
        "calibrate",
        "x.jsonl",
        "--policy",
        str(DEFAULT_POLICY_DIR),
        "--trust",
        "k",
        "--out",
        str(tmp_path),
    ]
    assert main([*args, "--engine", "vllm"]) == 2
    assert "realizes no shifted span behind a chat template" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--server", "http://x"], "--server: only with --engine sglang"),
        (["--engine", "sglang"], "needs --server URL"),
        (["--engine", "sglang", "--server", "http://x"], "needs --context-key FILE and --audience NAME"),
        (["--engine", "sglang", "--gateway", "http://x"], "needs --api-key-file"),
        (
            ["--engine", "sglang", "--server", "http://x", "--context-key", "k", "--audience", "a"],
            "needs --audit DIR",
        ),
    ],
)
def test_the_place_pairs_run_takes_its_own_flags_only(
    extra: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Server flags without --engine sglang, or sglang without a server, its keys or its audit log: exit 2."""
    args = [
        "calibrate",
        "x.jsonl",
        "--policy",
        str(DEFAULT_POLICY_DIR),
        "--trust",
        "k",
        "--out",
        str(tmp_path),
    ]
    assert main([*args, *extra]) == 2
    assert needle in capsys.readouterr().err


def test_the_reference_engine_compares_by_the_response_contract(tmp_path: Path) -> None:
    """--contracts on the reference engine: both figures are counted per cell and written, the
    contracts file is named in calibration.json, and a bad contracts file stops the run (exit 2)."""
    cap = _small_capture(tmp_path, 60)
    args = ["calibrate", str(cap), "--policy", str(DEFAULT_POLICY_DIR), "--trust", str(EX / "keyring.json")]
    args += [
        "--model",
        "tiny",
        "--sample",
        "2",
        "--methods",
        "none",
        "--contracts",
        str(EX / "contracts.yaml"),
    ]
    assert main([*args, "--out", str(tmp_path / "o")]) == 0
    report = json.loads((tmp_path / "o" / "calibration.json").read_text())
    assert report["contracts"] == str(EX / "contracts.yaml")
    cells = [c for s in report["scopes"] for c in s["shifted"].values()]
    assert cells and all(
        {"changed_answers", "changed_required_values", "regressions"} <= set(c) for c in cells
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ncontracts: [{id: x, compare: sometimes}]\n")
    assert main([*args[:-1], str(bad), "--out", str(tmp_path / "o2")]) == 2
