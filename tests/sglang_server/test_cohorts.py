"""The paired cohorts on a real SGLang server: allowed pairs realized, everything else cold.

Two servers: page size 1 with overlap scheduling (SGLang's CPU default) and page size 16 with
``--disable-overlap-schedule``, both with chunked prefill (1,024) well below the prompt length
(2,336 tokens). Per cohort (donor ``[S][I][E][Q1]``, recipient ``[S][E][Q2]``, E shifted by
``len(I)``; :func:`tests.sglang_server.scenarios.cohorts`):

- ``allowed``: same tenant and namespace: the recipient's E is realized from the donor (a
  shifted span) and SGLang reports it as host-hit tokens;
- ``other_tenant``: never a candidate (no decision), cold;
- ``unrelated``: same scope, other evidence: decided, denied by token verification, cold;
- ``no_context``: no token: no decision, exact-prefix reuse only.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_server import scenarios
from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import Server, pair_prompts, read_audit, settle, summarize


@pytest.fixture(params=["page1-overlap", "page16-no-overlap"])
def server(request: pytest.FixtureRequest, servers: Any) -> Server:
    srv: Server = servers(request.param)
    return srv


def test_cohorts_realize_only_allowed_pairs(server: Server) -> None:
    """Allowed pairs are realized (evidence length, as SGLang host hits); other cohorts stay cold."""
    out = scenarios.cohorts(server, f"c{server.config.page_size}", pairs=2)
    assert not out.problems, out.problems
    assert out.realizations == 2 and out.realized_tokens == 2 * 2048
    assert_healthy(server)


def test_concurrency_mixes_recipients_donors_and_plain_traffic(server: Server) -> None:
    """40 requests in flight (recipients, new donors, plain, other tenant): only recipients realize."""
    out = scenarios.concurrency(server, f"q{server.config.page_size}")
    assert not out.problems, out.problems
    assert out.realizations == 10
    assert_healthy(server)


def test_a_signed_per_task_plan_is_honoured_by_the_server(server: Server) -> None:
    """A quality rule for one task plans 25% of E recomputed: that head is prefilled, only the rest copied."""
    gw = server.gateway
    task = {"id": "quality-plan-check", "version": "1"}
    p = pair_prompts(f"plan-{server.config.page_size}", e_len=1024)
    ns = f"ns-plan-{server.config.page_size}"
    donor = server.generate(
        p.donor, rid=f"plan-donor-{ns}", extra_key=gw.token("acme", ns, p.donor_segs, task=task)
    )
    settle(server)
    rid = f"plan-warm-{ns}"
    warm = server.generate(p.recipient, rid=rid, extra_key=gw.token("acme", ns, p.recipient_segs, task=task))
    assert donor.ok and warm.ok, (donor.error, warm.error)
    audit = summarize(read_audit(server.files.audit_dir, wait_s=20))
    [decision] = [d for d in audit.decisions[rid] if d["decision"] == "allow"]
    [span] = [s for s in decision["approved_spans"] if s["kind"] == "shifted"]
    assert (span["recipient_start"], span["length"], span["recompute"]) == (p.evidence_start, 1024, 256)
    head = (
        -(-(p.evidence_start + 256) // server.config.page_size) * server.config.page_size - p.evidence_start
    )
    assert audit.realized.get(rid) == 1024 - head  # NOTE: the copy starts after the head, on a page
    [event] = [e for e in audit.realizations if e["request_id"] == rid]
    assert min(s["recipient_start"] for s in event["spans"]) == p.evidence_start + head
    assert_healthy(server)


def test_evidence_behind_a_new_wrapper_is_realized_mid_prompt(server: Server) -> None:
    """Evidence approved after fresh tokens is realized between prefill chunks (two regions too)."""
    out = scenarios.regions(server, f"g{server.config.page_size}")
    assert not out.problems, out.problems
    assert out.realizations == 2 + 4 and out.realized_tokens == 1024 + 4 * 1024
    assert_healthy(server)
