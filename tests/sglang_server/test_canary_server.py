"""Canaries in a real SGLang server (issue 14): a degraded scope is caught and turned off, only it.

The ``canary`` server serves a one-layer tiny Llama (a re-rotated shifted span there is what a cold
prefill computes, to float rounding) with ``SEMGOV_CANARY_RATE=1`` and a budget of 0, and the
rig's fault ``SEMGOV_RIG_DEGRADE_TASK``: realizations for one task have their values zeroed right
after the copy. Recipients of two tasks get shifted evidence; the hook replays each one cold
through the server's own ``/generate`` when it is idle and compares 8 greedy tokens. The healthy
task's canaries match; the degraded task's first canary regresses, which turns shifted reuse off
for that scope only (tenant, namespace, adapter, task and contract: issue 31): its next recipient
gets no shifted KV, the healthy scope's still does.
"""

from __future__ import annotations

import time
from typing import Any

from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import (
    CANARY_DEGRADED_TASK,
    Server,
    pair_prompts,
    read_audit,
    settle,
    summarize,
)

HEALTHY = {"id": "qa", "version": "1"}
DEGRADED = {"id": CANARY_DEGRADED_TASK, "version": "1"}


def _pair(server: Server, tag: str, task: dict[str, str], namespace: str) -> tuple[str, Any]:
    """A donor run, then its recipient (shifted evidence); the recipient's rid and result."""
    gw = server.gateway
    p = pair_prompts(tag, e_len=512)
    key = gw.token("acme", namespace, p.donor_segs, task=task)
    donor = server.generate(p.donor, rid=f"{tag}-donor", extra_key=key)
    assert donor.ok, donor.error
    settle(server)
    rid = f"{tag}-rcp"
    warm = server.generate(
        p.recipient,
        rid=rid,
        extra_key=gw.token("acme", namespace, p.recipient_segs, task=task),
        max_new_tokens=8,
    )
    assert warm.ok and len(warm.output_ids) == 8, warm.error
    return rid, warm


def _canaries(server: Server, count: int, timeout: float = 180.0) -> list[dict[str, Any]]:
    """The audit log's canary events, once there are at least ``count`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        found = summarize(read_audit(server.files.audit_dir)).canaries
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(1.0)


def test_a_degraded_scope_is_caught_by_canaries_and_only_it_is_turned_off(servers: Any) -> None:
    """Healthy task: canary matches, still realized later. Degraded task: the canary regresses, shifted
    reuse goes off for it (audited), and its next recipient is not realized."""
    server: Server = servers("canary")
    ok_rid, _ = _pair(server, "canary-ok-1", HEALTHY, "ns-healthy")
    bad_rid, _ = _pair(server, "canary-bad-1", DEGRADED, "ns-degraded")
    events = _canaries(server, 3)
    by_kind = [(e["kind"], e["request_id"], e["detail"].split(":")[0]) for e in events]
    assert ("canary", ok_rid, "match") in by_kind, by_kind
    assert any(k == "canary" and r == bad_rid and d.startswith("regression") for k, r, d in by_kind), by_kind
    off = [e for e in events if e["kind"] == "shifted_reuse_disabled"]
    assert len(off) == 1 and off[0]["request_id"] == bad_rid and CANARY_DEGRADED_TASK in off[0]["detail"]

    ok2, _ = _pair(server, "canary-ok-2", HEALTHY, "ns-healthy")
    bad2, _ = _pair(server, "canary-bad-2", DEGRADED, "ns-degraded")
    audit = summarize(read_audit(server.files.audit_dir, wait_s=20))
    assert audit.realized.get(ok_rid, 0) >= 512 and audit.realized.get(bad_rid, 0) >= 512
    assert audit.realized.get(ok2, 0) >= 512, audit.realized
    assert audit.allowed(bad2) == 1 and audit.realized.get(bad2, 0) == 0, audit.realized
    offs = [e["request_id"] for e in audit.canaries if e["kind"] == "shifted_reuse_disabled"]
    assert offs == [bad_rid]
    assert server.files.audit_dir.joinpath("canary-state.json").exists()
    assert_healthy(server)
