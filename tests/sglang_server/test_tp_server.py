"""Tensor parallelism on a real SGLang server on CPU (``--tp-size 2``, gloo, one core per rank).

Every rank runs its own scheduler, tree and KV shard in lockstep; only rank 0 decides and
audits, and every rank applies rank 0's round message (:mod:`engine_hooks.sglang.tp`). The
servers run with SGLang's strict KV-pool checks after every batch: a rank that admitted a request
differently from the other would fail them, or hang the next forward's all-reduce.
(:mod:`tests.sglang_server.test_kv_copy_server` checks each rank's copied shard against a cold
prefill.)
"""

from __future__ import annotations

from typing import Any

from tests.sglang_server import scenarios
from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import pair_prompts, read_audit, settle, summarize


def test_ranks_realize_one_decision_each_and_audit_once(servers: Any) -> None:
    """With two TP ranks, allowed pairs are realized on both (front and regions), audited once."""
    server = servers("tp2")
    out = scenarios.cohorts(server, "tpc", pairs=1)
    assert not out.problems, out.problems
    assert out.realizations == 1 and out.realized_tokens == 2048
    out = scenarios.regions(server, "tpg")
    assert not out.problems, out.problems
    assert out.realizations == 2 + 4 and out.realized_tokens == 1024 + 4 * 1024
    # NOTE: the counts above come from the audit log: one realization event per realization (rank
    # 0 writes; a second writer would double them), with both ranks built as semgov ranks.
    text = server.log_text()
    assert "tensor-parallel rank 0 of 2" in text and "tensor-parallel rank 1 of 2" in text
    assert_healthy(server)


def test_ranks_stay_in_lockstep_under_concurrent_mixed_traffic(servers: Any) -> None:
    """40 requests in flight on two TP ranks (recipients, donors, plain, other tenant): recipients realize."""
    server = servers("tp2")
    out = scenarios.concurrency(server, "tpq")
    assert not out.problems, out.problems
    assert out.realizations == 10
    assert_healthy(server)


def test_a_rank_that_misses_donors_forgets_them_and_reuse_stays_on(servers: Any) -> None:
    """Rank 1 lacks every donor rank 0 registers: every rank forgets those donors (their recipients run
    cold on both ranks) and semantic reuse is not turned off (issue 31: before, it went off everywhere)."""
    server = servers("tp2-diverge")
    gw = server.gateway
    p = pair_prompts("tp-diverge", e_len=1024)
    d = server.generate(p.donor, rid="tpd-d", extra_key=gw.token("acme", "ns-tpd", p.donor_segs))
    settle(server)
    r = server.generate(p.recipient, rid="tpd-r", extra_key=gw.token("acme", "ns-tpd", p.recipient_segs))
    assert d.ok and r.ok, (d.error, r.error)
    q = pair_prompts("tp-diverge-2", e_len=1024)
    d2 = server.generate(q.donor, rid="tpd-d2", extra_key=gw.token("acme", "ns-tpd2", q.donor_segs))
    settle(server)
    r2 = server.generate(q.recipient, rid="tpd-r2", extra_key=gw.token("acme", "ns-tpd2", q.recipient_segs))
    assert d2.ok and r2.ok, (d2.error, r2.error)
    audit = summarize(read_audit(server.files.audit_dir))
    assert not audit.realized, audit.realized  # cold, both times
    assert not [v for v in audit.violations if v.get("kind") in ("reuse_disabled", "invariant_violation")]
    assert server.alive() and server.healthy(timeout=60)
    assert not server.fatal_lines(), server.fatal_lines()
    assert "has no copy of a donor: forgotten" in server.log_text()  # rank 1 said why
