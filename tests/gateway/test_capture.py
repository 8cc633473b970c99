"""Capture at the edge: answered requests only, with candidates of every tenant and signed
provenance, read back by the real ``semgov check``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from semgov.gateway import Gateway, GatewayConfig, Target
from semgov.gateway.capture import CaptureConfig
from semgov.intake.capture import read_captured
from tests.gateway.fixtures import AUDIENCE, KEYS, FakeEngine, tokenizer_dir, write_files

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"

EVIDENCE = "Research file: revenue rose to 42 million in the third quarter, margin 7.5 percent. " * 20


def chat(namespace: str, question: str) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "system", "content": "Answer in JSON."},
            {"role": "user", "content": EVIDENCE},
            {"role": "user", "content": question},
        ],
        "semgov": {"namespace": namespace, "segments": [{"message": 1, "role": "evidence"}]},
        "max_tokens": 4,
    }


def captured(tmp_path: Path, *, keep_text: bool, mode: str = "ok") -> list[Any]:
    tenants, key = write_files(tmp_path)
    cap = CaptureConfig(
        directory=tmp_path / "capture", rate=1.0, provenance_key=ASSETS / "provenance-k1.pem",
        policy_version="default@1", keyring=ASSETS / "keyring.json", keep_text=keep_text,
    )  # fmt: skip

    async def main() -> None:
        fake = FakeEngine(mode=mode)
        target = Target("sglang", await fake.start(), "tiny")
        gw = Gateway(GatewayConfig(tenants, key, AUDIENCE, target, tokenizer_dir(), capture=cap))
        await gw.start()
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gw.app()), base_url="http://gw"
            ) as c:
                for tenant, body in (("acme", chat("acme/q3", "What was revenue?")),
                                     ("globex", chat("globex/q3", "What was revenue?")),
                                     ("globex", chat("acme/q3", "What was revenue?")),  # 403: never captured
                                     ("acme", chat("acme/q3", "What was the margin?"))):  # fmt: skip
                    await c.post(
                        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEYS[tenant]}"}
                    )
        finally:
            await gw.stop()  # NOTE: writes what is queued
            await fake.stop()

    asyncio.run(main())
    files = sorted((tmp_path / "capture").glob("*.jsonl"))
    return list(read_captured(tmp_path / "capture")) if any(f.stat().st_size for f in files) else []


def test_answered_requests_are_captured_with_every_tenants_recent_requests_as_candidates(
    tmp_path: Path,
) -> None:
    """Three answered requests are captured (not the 403); the last has both earlier ones as candidates."""
    reqs = [r for r in captured(tmp_path, keep_text=False)]
    assert [(r.tenant, r.namespace) for r in reqs] == [
        ("acme", "acme/q3"),
        ("globex", "globex/q3"),
        ("acme", "acme/q3"),
    ]
    last = reqs[-1]
    assert [c.donor_id for c in last.candidates] == [reqs[1].request_id, reqs[0].request_id]
    assert all(c.provenance.key_id == "k1" for c in last.candidates)
    assert all(c.similarity > 0.5 for c in last.candidates)  # NOTE: the same evidence, another question
    assert last.prompt.text is None and not last.candidates[0].provenance.payload["pii"]["scanned"]
    assert [s.role for s in last.prompt.segments] == ["system", "evidence", "question"]


def test_a_failed_upstream_captures_nothing(tmp_path: Path) -> None:
    """Requests the engine failed are never captured (nothing half-recorded)."""
    assert captured(tmp_path, keep_text=False, mode="status:500") == []


def test_semgov_check_replays_a_gateway_capture(tmp_path: Path) -> None:
    """The real `semgov check` reads the capture: other tenants' donors are denied at the tenant gate."""
    reqs = captured(tmp_path, keep_text=True)
    assert reqs[-1].prompt.text is not None and reqs[-1].candidates[0].provenance.payload["pii"]["scanned"]
    proc = subprocess.run(
        [sys.executable, "-m", "semgov.cli.main", "check", str(tmp_path / "capture"), "--policy",
         str(ROOT / "policies" / "default"), "--trust", str(ASSETS / "keyring.json"), "--signing-key",
         str(ASSETS / "decision-signing-key.pem"), "--format", "jsonl"],
        capture_output=True, text=True, cwd=str(ROOT), timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    by_pair = {(r["request_id"], r["donor_id"]): r for r in records}
    cross = by_pair[(reqs[2].request_id, reqs[1].request_id)]
    assert cross["decision"] == "deny" and cross["donor_tenant"] == "globex"
    assert any(g["gate"] == "tenant" and g["result"] == "fail" for g in cross["gates"]), cross["gates"]
    same = by_pair[(reqs[2].request_id, reqs[0].request_id)]
    assert same["donor_tenant"] == "acme"
    assert all(
        g["result"] == "pass" for g in same["gates"] if g["gate"] in ("tenant", "namespace", "provenance")
    ), same["gates"]
