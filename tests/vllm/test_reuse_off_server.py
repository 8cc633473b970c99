"""A KV cache the connector cannot read, in a real vLLM 0.32 CPU server (issue 33): the server
serves, and governed reuse is off, never silently: a start-up log line naming the backend and the
setting, ``semgov:reuse_disabled`` on ``/metrics`` and one ``reuse_disabled`` event in the audit log
once the engine has run a step (the scheduler side learns it from the worker's first report)."""

from __future__ import annotations

from pathlib import Path

from tests.sglang_server.rig import pair_prompts, verify_audit
from tests.vllm.rig import VllmServerConfig, launch_vllm, require_vllm_python


def test_a_quantized_kv_cache_turns_reuse_off_logged_audited_and_on_metrics(tmp_path: Path) -> None:
    """``--kv-cache-dtype fp8`` (vLLM's CPU backend accepts it; keys in it cannot be re-rotated
    exactly): the worker's start-up line names CPU_ATTN and ``--kv-cache-dtype auto``; a donor and its
    recipient are served, never decided, and reuse-off is on /metrics and in the audit log, once."""
    cfg = VllmServerConfig(eager=True, num_blocks=40, max_model_len=2048, kv_cache_dtype="fp8")
    with launch_vllm(cfg, tmp_path, require_vllm_python()) as s:
        lines = [ln for ln in s.log_path.read_text().splitlines() if "KV reuse off (cache layout)" in ln]
        assert lines and "backend=CPU_ATTN" in lines[0] and "--kv-cache-dtype auto" in lines[0], s.tail()
        p = pair_prompts("reuse-off", e_len=512)
        d = s.complete(p.donor, "off-d", s.token("acme", "ns", p.donor_segs))
        r = s.complete(p.recipient, "off-r", s.token("acme", "ns", p.recipient_segs))
        assert d.status == 200 and r.status == 200 and d.tokens and r.tokens, (d.error, r.error)
        assert s.metrics().get("semgov:reuse_disabled") == 1.0
        audit = s.audit()
        off = [v for v in audit.violations if v.get("kind") == "reuse_disabled"]
        assert len(off) == 1 and "--kv-cache-dtype auto" in str(off[0]["detail"]), audit.violations
        assert audit.decisions == {} and audit.realized == {}
        assert s.fatal_lines() == [] and s.alive()
        assert verify_audit(s.files) is None
