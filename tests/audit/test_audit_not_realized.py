"""``semgov audit stats`` and ``report`` count allows not realized by their reason code (the head of
a ``realization_failed`` event's detail, docs/formats.md "Allows not realized"); the records are
ordinary v2 engine events and verify as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semgov.audit.verify_dir import verify_log
from semgov.cli.main import main
from semgov.signing.engine_events import engine_event, sign_engine_event
from tests.audit.test_audit_report import figures
from tests.audit_fixtures import AT, KEY, PUB, PUB_PEM, decisions, realization, write_log


def _failed(decision: bytes, detail: str) -> bytes:
    dec = json.loads(decision)
    unsigned = engine_event(
        "realization_failed",
        engine="vllm",
        at=AT,
        request_id=dec["request_id"],
        decision_id=dec["decision_id"],
        donor_id=dec["donor_id"],
        detail=detail,
    )
    return sign_engine_event(unsigned, KEY).canonical


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    ds = decisions(keys, KEY, 6)
    allows = [d for d in ds if json.loads(d)["decision"] == "allow"]
    assert len(allows) == 4
    events = [
        realization(allows[0], KEY),
        _failed(allows[1], "late: decided in 930 ms; the engine had stopped waiting"),
        _failed(allows[2], "discarded_by_engine: vLLM took 0 of the 1024 tokens answered"),
        _failed(allows[3], "RuntimeError: written before the reason codes"),
    ]
    d = tmp_path_factory.mktemp("not-realized") / "log"
    write_log(d, ds + events)
    return d


def test_the_events_verify(log: Path) -> None:
    """Reason codes live in the detail: every record still verifies under the v2 schema."""
    rep = verify_log(log, public_key=PUB, workers=1)
    assert rep.ok, rep.problems


def test_stats_counts_allows_not_realized_by_reason(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """stats prints one line: the allows not realized and their count by reason code."""
    assert main(["audit", "stats", str(log)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "3 allows not realized: (unclassified) 1, discarded_by_engine 1, late 1" in out


def test_report_counts_allows_not_realized_by_reason(
    log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report's engine-event section has a figure per reason code."""
    out = tmp_path / "report.html"
    assert main(["audit", "report", str(log), "--out", str(out), "--pubkey", PUB_PEM]) == 0
    page = figures(out.read_text())
    got = {k: v for k, v in page.figures.items() if k.startswith("not_realized:")}
    assert got == {
        "not_realized:late": "1",
        "not_realized:discarded_by_engine": "1",
        "not_realized:(unclassified)": "1",
    }
    assert page.figures.get("failure:RuntimeError") == "1" and "failure:late" not in page.figures
