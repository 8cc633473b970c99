"""``semgov calibrate --engine sglang`` against a real SGLang server (issue 47): the whole loop.

A real server (the tiny model, the semgov backend, live capture on) serves production traffic:
shifted-evidence pairs under ``acme/prod``, captured by the hook itself. ``semgov calibrate``
then runs that capture against the same server, through its ``/generate`` with tokens it mints:
every pair's donor, cold run and governed runs in the run's own namespace, decided under the
live policy plus each plan (the records say so), the realized tokens read back from the server's
own audit log, and every pair's donors released after. Production's scopes are never touched,
nothing is left behind, a stopped run resumes where it stopped, and a server running another
policy than ``--policy`` stops the run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from semgov.cli.main import main
from semgov.context import CALIBRATION_MARK, CalibrationClaim, calibration_namespace, make_context_token
from semgov.policy.yaml.model import load_policy
from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import (
    AUDIENCE,
    CONTEXT_SECRET,
    RIG_POLICY,
    Server,
    launch,
    pair_prompts,
    read_audit,
    server_configs,
    settle,
)

PROD = "acme/prod"
PLANS = "none,trailing:64"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server capturing every decided request, with production traffic already captured."""
    work = tmp_path_factory.mktemp("calibrate-server")
    capture = work / "capture"
    base = server_configs("cpu")["page16-no-overlap"]
    cfg = replace(
        base, page_size=1, hook_env={"SEMGOV_CAPTURE_DIR": str(capture), "SEMGOV_CAPTURE_RATE": "1"}
    )
    with launch(cfg, work) as s:
        gw = s.gateway
        for i in range(3):
            p = pair_prompts(f"cal-prod-{i}", s_len=128, e_len=512, wrapper=24 if i % 2 else 0)
            assert s.generate(
                p.donor, rid=f"prod-{i}-donor", extra_key=gw.token("acme", PROD, p.donor_segs)
            ).ok
            settle(s)
            rcp = s.generate(p.recipient, rid=f"prod-{i}", extra_key=gw.token("acme", PROD, p.recipient_segs))
            assert rcp.ok, rcp.error
        deadline = time.monotonic() + 30
        while sum(1 for f in capture.glob("*.jsonl") for _ in f.open()) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
        yield s


def _calibrate(server: Server, out: Path, *extra: str, policy: Path = RIG_POLICY) -> int:
    f = server.files
    return main([
        "calibrate", str(f.dir.parent / "capture"), "--policy", str(policy), "--trust", str(f.trust),
        "--out", str(out), "--engine", "sglang", "--server", f"http://{server.host}:{server.port}",
        "--context-key", str(f.context_key),
        "--audience", AUDIENCE, "--audit", str(f.audit_dir), "--methods", PLANS, "--sample", "3",
        "--max-new-tokens", "6", "--floor-pairs", "1", *extra,
    ])  # fmt: skip


def _decisions(server: Server) -> list[dict[str, Any]]:
    return [
        r
        for r in read_audit(server.files.audit_dir, wait_s=20)
        if str(r.get("schema")).startswith("semgov.decision/")
    ]


def test_a_run_measures_every_pair_in_the_server_and_touches_no_production_scope(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every sampled pair is realized under each plan, counted from the server's own audit log,
    decided under '<live revision>+calibrate:<plan>' in the run's namespace only; cold runs get no
    reuse; production's decisions are the same before and after; the policy written loads."""
    before = [d for d in _decisions(server) if CALIBRATION_MARK not in d["namespace"]]
    out = tmp_path / "out"
    assert _calibrate(server, out) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    report = json.loads((out / "calibration.json").read_text())
    assert report["engine"] == "server" and report["measured"] == 3 and report["counted"] == 6, report
    assert report["realized_tokens"] >= 6 * 400 and report["floor"] == {"runs": 1, "identical": 1}
    rows = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    done = [r for r in rows if r["state"] == "done"]
    assert all(r["cold"]["cached_tokens"] == 0 for r in done)  # NOTE: nothing served the cold runs
    assert all(m["realized"] > 0 and m["counted"] for r in done for m in r["methods"].values())
    after = _decisions(server)
    live = load_policy(RIG_POLICY).revision
    mine = [d for d in after if CALIBRATION_MARK in d["namespace"]]
    assert len(mine) == 6 and {d["policy"]["revision"] for d in mine} == {
        f"{live}+calibrate:none",
        f"{live}+calibrate:trailing:64",
    }
    assert all(d["namespace"].startswith(PROD + CALIBRATION_MARK) for d in mine)
    assert [d for d in after if CALIBRATION_MARK not in d["namespace"]] == before
    run = json.loads((out / "run.json").read_text())["run"]
    released = [
        r for r in read_audit(server.files.audit_dir)
        if r.get("kind") == "calibration_released" and f"calibration run {run}-" in r["detail"]
    ]  # fmt: skip
    assert len(released) == 3 and all("1 donor(s) dropped" in r["detail"] for r in released), released
    assert "wrote" in printed and "trailing:64" in printed
    written = load_policy(out / "yaml")
    assert (
        written.quality.rules[0].task == "qa"
        and "Calibrated by `semgov calibrate` in the server" in (out / "yaml" / "policy.yaml").read_text()
    )
    assert_healthy(server)


def test_no_donor_is_left_behind(server: Server, tmp_path: Path) -> None:
    """After a run, a recipient in one of its pairs' scopes finds no donor there (no decision)."""
    out = tmp_path / "out"
    assert _calibrate(server, out, "--max-pairs", "1", "--methods", "none") == 0
    run = json.loads((out / "run.json").read_text())["run"]
    p = pair_prompts("cal-probe", s_len=128, e_len=512)
    ns = calibration_namespace(PROD, f"{run}-0")
    claim = CalibrationClaim(f"{run}-0", "recipient", "none")
    token = make_context_token(CONTEXT_SECRET, audience=AUDIENCE, tenant="acme", namespace=ns,
                               task={"id": "qa", "version": "1"},
                               response_contract={"id": "answer-json", "schema_sha256": "a" * 64},
                               segments=list(p.recipient_segs), calibration=claim)  # fmt: skip
    assert server.generate(p.recipient, rid="cal-probe", extra_key=token).ok
    time.sleep(2)
    assert not [d for d in _decisions(server) if d["request_id"] == "cal-probe"]


def test_a_stopped_run_resumes_where_it_stopped(server: Server, tmp_path: Path) -> None:
    """A run stopped by --budget-s keeps its pairs; --resume measures only the others; a second run
    into the same --out without --resume is refused, and so is a resume with other settings."""
    out = tmp_path / "out"
    assert _calibrate(server, out, "--budget-s", "0.001", "--methods", "none") == 0
    first = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    assert [r["state"] for r in first] == ["started", "done"]  # NOTE: one pair, then the budget
    assert _calibrate(server, out, "--methods", "none") == 2
    assert _calibrate(server, out, "--resume", "--methods", "none,trailing:64") == 2
    assert _calibrate(server, out, "--resume", "--methods", "none") == 0
    rows = [json.loads(x) for x in (out / "progress.jsonl").read_text().splitlines()]
    assert sorted(r["case"] for r in rows if r["state"] == "done") == [0, 1, 2]
    assert json.loads((out / "calibration.json").read_text())["measured"] == 3


def test_a_server_running_another_policy_stops_the_run(
    server: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--policy other than the server's live one: the first decision's revision says so, exit 2."""
    other = tmp_path / "other"
    other.mkdir()
    text = RIG_POLICY.joinpath("policy.yaml").read_text().replace("min: 0.6", "min: 0.61", 1)
    (other / "policy.yaml").write_text(text)
    assert _calibrate(server, tmp_path / "out", "--methods", "none", "--max-pairs", "1", policy=other) == 2
    assert "runs another policy than --policy" in capsys.readouterr().err


def test_the_whole_loop_runs_against_a_real_server(tmp_path: Path) -> None:
    """benchmarks/calibration_loop.py --smoke (tiny model, real server): capture halves, calibrate in
    the server, deploy the written policy by hot reload, run the held-out half; its table is printed,
    every held-out recipient was decided under the deployed revision, and the audit log verifies."""
    import subprocess
    import sys

    from tests.sglang_server.rig import ROOT

    out = tmp_path / "loop"
    proc = subprocess.run(
        [sys.executable, "benchmarks/calibration_loop.py", "--smoke", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == [] and summary["calibration"]["counted"] >= 2
    rows = [json.loads(x) for x in (out / "heldout.jsonl").read_text().splitlines()]
    written = load_policy(out / "calibrate" / "yaml").revision
    assert len(rows) == 2 and all(r["governed"]["revision"] == [written] for r in rows), rows
    assert all(r["governed"]["realized"] > 0 for r in rows)  # NOTE: --smoke keeps every plan (budget 1)
    assert "held-out" in proc.stdout and "target" in proc.stdout
