"""A worker that refuses its attention backend, in a real vLLM 0.32 CPU server (issue 33): the server
serves, and governed reuse is off, never silently: a start-up log line naming the backend and the
setting that selects a supported one, then, once the engine has run a step (the scheduler side
learns it from the worker's first report, through vLLM's own worker-metadata transport),
``semgov:reuse_disabled`` 1 on ``/metrics`` and one ``reuse_disabled`` event in the audit log.

vLLM's CPU build offers no attention backend but ``CPU_ATTN``, so the connector is loaded from
:mod:`tests.vllm.flex_named_connector`, where the layers' backend names read ``FLEX_ATTENTION``."""

from __future__ import annotations

from pathlib import Path

from tests.sglang_server.rig import pair_prompts, verify_audit
from tests.vllm.rig import VllmServerConfig, launch_vllm, require_vllm_python


def test_a_refused_backend_turns_reuse_off_logged_audited_and_on_metrics(tmp_path: Path) -> None:
    """The worker's start-up line names FLEX_ATTENTION and ``--attention-backend CPU_ATTN``; a donor and
    its recipient are served and never decided; reuse-off is on /metrics and audited once."""
    cfg = VllmServerConfig(
        eager=True, num_blocks=40, max_model_len=2048, connector_module="tests.vllm.flex_named_connector"
    )
    with launch_vllm(cfg, tmp_path, require_vllm_python()) as s:
        lines = [ln for ln in s.log_path.read_text().splitlines() if "KV reuse off (cache layout)" in ln]
        assert lines, s.tail()
        assert "backend=FLEX_ATTENTION" in lines[0] and "--attention-backend CPU_ATTN" in lines[0], lines[0]
        assert s.metrics().get("semgov:reuse_disabled", 0.0) == 0.0  # NOTE: no step has run yet
        p = pair_prompts("reuse-off", e_len=512)
        d = s.complete(p.donor, "off-d", s.token("acme", "ns", p.donor_segs))
        r = s.complete(p.recipient, "off-r", s.token("acme", "ns", p.recipient_segs))
        assert d.status == 200 and r.status == 200 and d.tokens and r.tokens, (d.error, r.error)
        assert s.metrics().get("semgov:reuse_disabled") == 1.0
        audit = s.audit()
        off = [v for v in audit.violations if v.get("kind") == "reuse_disabled"]
        assert len(off) == 1 and "FLEX_ATTENTION" in str(off[0]["detail"]), audit.violations
        assert audit.decisions == {} and audit.realized == {} and audit.failed == []
        assert s.fatal_lines() == [] and s.alive()
        assert verify_audit(s.files) is None
