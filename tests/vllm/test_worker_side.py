"""The connector's worker side (engine_hooks.vllm.worker_side) as vLLM drives it, in semgov's
environment: attention layers found in vLLM's forward context, their backend's own cache writer
learned at ``register_kv_caches`` (here a FLASH_ATTN-like layer whose ``do_kv_cache_update`` is the
reference writer, over NHD views on CPU), saves and loads through the copy engine, donors reported
saved only once their copies completed, and a backend or cache it cannot read turning reuse off at
start: a log line naming the backend and the setting, and ``WorkerReport.reuse_off``, which the
scheduler side audits as ``reuse_disabled`` (gauge ``semgov:reuse_disabled``) (issue 33)."""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.vllm import worker_side
from engine_hooks.vllm.device_layout import flash_reference_writer
from engine_hooks.vllm.meta import LoadOp, LoadPiece, SaveOp, StepPlan, WorkerReport
from engine_hooks.vllm.worker_side import WorkerSide
from tests.sglang_server.rig import pair_prompts, read_audit, summarize
from tests.vllm.test_device_copies import ManualStreams
from tests.vllm.test_scheduler_side import GW, _blocks, _donor, _make_side, _req, _step

H, D, BS, BLOCKS, LAYERS = 2, 16, 16, 12, 2
ROPE = RopeSpec(rotary_dim=D, head_dim=D, base=10000.0, is_neox_style=True)


def _layer(backend: str) -> Any:
    """An attention layer as vLLM's forward context holds it: its backend class, and an impl whose
    ``do_kv_cache_update`` writes like FLASH_ATTN's ``reshape_and_cache_flash``."""
    ref = flash_reference_writer(D)

    def update(
        layer: Any, key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor
    ) -> None:
        ref(key, value, kv, slots)

    return NS(
        get_attn_backend=lambda: NS(get_name=lambda: backend),
        impl=NS(kv_sharing_target_layer_name=None, do_kv_cache_update=update),
    )


def _caches(order: str = "NHD", device: str = "cpu") -> dict[str, torch.Tensor]:
    """LAYERS ``[B, H, N, 2D]`` views of one allocation: NHD (vLLM's default, LBNHC) or head-outer
    (LHBNC, which no block window holds)."""
    if order == "NHD":
        full = torch.zeros(LAYERS, BLOCKS, BS, H, 2 * D, device=device).transpose(2, 3)
    else:
        full = torch.zeros(LAYERS, H, BLOCKS, BS, 2 * D, device=device).transpose(1, 2)
    return {f"model.layers.{i}.self_attn.attn": full[i] for i in range(LAYERS)}


def _worker(
    caches: dict[str, torch.Tensor],
    backend: str = "FLASH_ATTN",
    kv_cache_dtype: str = "auto",
    ctx: Any = None,
) -> WorkerSide:
    """A worker side registered on ``caches``, every layer of ``backend`` unless ``ctx`` says otherwise."""
    mc = NS(get_num_kv_heads=lambda pc: H, get_head_size=lambda: D, hf_config=NS(model_type="none"))
    forward = {n: _layer(backend) for n in caches} if ctx is None else ctx
    cfg = NS(
        model_config=mc,
        parallel_config=None,
        cache_config=NS(block_size=BS, cache_dtype=kv_cache_dtype),
        compilation_config=NS(static_forward_context=forward),
    )
    w = WorkerSide(cfg)
    w.rope = ROPE
    w.register(caches)
    return w


def _fill(w: WorkerSide, blocks: list[int], n: int, seed: int) -> None:
    """The forward's writes: random K/V for positions ``[0, n)`` of a request on ``blocks``."""
    g = torch.Generator().manual_seed(seed)
    slots = torch.tensor([blocks[p // BS] * BS + p % BS for p in range(n)])
    for c in w.caches.values():
        flash_reference_writer(D)(
            torch.randn(n, H, D, generator=g), torch.randn(n, H, D, generator=g), c, slots
        )


def test_a_gpu_backend_is_learned_through_its_own_writer_and_donor_kv_round_trips() -> None:
    """FLASH_ATTN's layer writer is learned; a donor saved whole is reported saved, and loads into
    another request's blocks land exact (prefix) and re-rotated (shifted by a non-block amount)."""
    w = _worker(_caches())
    assert w.broken is None and w.layout is not None and w.layout.backend == "FLASH_ATTN"
    assert w.take_report() is None  # nothing to say: reuse is on
    donor = [1, 2, 3]
    _fill(w, donor, 40, seed=1)
    w.save(StepPlan(saves=[SaveOp("d", tuple(donor), 0, 40, 40)]))
    rep = w.take_report()
    assert rep is not None and rep.saved == {"d": 1} and rep.save_failed == {}
    stored = [
        w.layout.gather(c, torch.tensor([donor[p // BS] * BS + p % BS for p in range(40)]))
        for c in w.caches.values()
    ]
    recipient = (7, 8, 9, 10)
    pieces = (LoadPiece(0, 0, 16), LoadPiece(21, 16, 24))  # the second shifted by 5
    w.start_load(StepPlan(loads=[LoadOp("r", "d", recipient, pieces)]))
    rep = w.take_report()
    assert rep is not None and rep.loaded == {"r": 40} and rep.failed == {} and w.load_errors() == set()
    for i, c in enumerate(w.caches.values()):
        got = w.layout.gather(c, torch.tensor([recipient[p // BS] * BS + p % BS for p in range(21, 45)]))
        assert torch.equal(got[:, 1], stored[i][16:, 1])
        assert torch.equal(got[:, 0], rerotate_keys(stored[i][16:, 0], torch.full((24,), 5), ROPE))
        head = w.layout.gather(c, torch.tensor([recipient[0] * BS + p for p in range(16)]))
        assert torch.equal(head, stored[i][:16])


def test_a_donor_is_reported_saved_only_once_its_copies_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a device with side streams, a save still in flight is not reported saved and a load of it
    is refused (its blocks go back to vLLM); once its events complete, the next report says saved."""
    streams = ManualStreams()
    monkeypatch.setattr(worker_side, "_streams", lambda caches: streams)
    w = _worker(_caches())
    _fill(w, [1, 2], 32, seed=2)
    w.save(StepPlan(saves=[SaveOp("d", (1, 2), 0, 32, 32)]))
    assert w.take_report() is None and streams.log[-1] == "compute_waits:save"
    w.start_load(StepPlan(loads=[LoadOp("r", "d", (5, 6), (LoadPiece(0, 0, 32),))]))
    rep = w.take_report()
    assert rep is not None and "not complete" in rep.failed["r"] and w.load_errors() == {5, 6}
    streams.finish()
    rep = w.take_report()
    assert rep is not None and rep.saved == {"d": 1}


REFUSALS = [
    ("FLEX_ATTENTION", "auto", "NHD", "attention backend FLEX_ATTENTION", "--attention-backend FLASH_ATTN"),
    ("FLASH_ATTN", "fp8", "NHD", "--kv-cache-dtype fp8 on FLASH_ATTN", "--kv-cache-dtype auto"),
    ("FLASH_ATTN", "auto", "HND-outer", "head-outer layout", "VLLM_KV_CACHE_LAYOUT=LBNHC"),
]


@pytest.mark.parametrize(("backend", "dtype", "order", "what", "setting"), REFUSALS)
def test_a_backend_or_cache_it_cannot_read_turns_reuse_off_at_start_naming_the_setting(
    capsys: pytest.CaptureFixture[str], backend: str, dtype: str, order: str, what: str, setting: str
) -> None:
    """An unsupported backend, a quantized cache or a head-outer layout: an error line at start naming
    the backend and the setting that selects a supported one; the first report carries it (once);
    every save and load then fails, its blocks going back to vLLM."""
    device = "meta" if order == "NHD" else "cpu"  # NOTE: meta stands for a GPU: refused before any write
    w = _worker(_caches(order, device), backend, dtype)
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "KV reuse off (cache layout)" in ln)
    assert f"backend={backend}" in line and what in line and setting in line, line
    assert w.broken is not None and w.layout is None
    rep = w.take_report()
    assert rep is not None and what in rep.reuse_off and setting in rep.reuse_off
    w.save(StepPlan(saves=[SaveOp("d", (1,), 0, 8, 8)]))
    w.start_load(StepPlan(loads=[LoadOp("r", "d", (3,), (LoadPiece(0, 0, 8),))]))
    rep = w.take_report()
    assert rep is not None and rep.reuse_off == "" and "reuse is off" in rep.save_failed["d"]
    assert "reuse is off" in rep.failed["r"] and w.load_errors() == {3}


def test_on_cpu_an_unsupported_backend_names_vllms_cpu_backend() -> None:
    """A CPU worker whose layers are not CPU_ATTN's is told the setting that selects it."""
    w = _worker(_caches(), "TORCH_SDPA")
    assert w.broken is not None and "--attention-backend CPU_ATTN" in w.broken


def test_a_cache_that_belongs_to_no_attention_layer_turns_reuse_off() -> None:
    """A registered cache whose layer is missing from vLLM's forward context: reuse off, said why."""
    w = _worker(_caches(), ctx={})
    rep = w.take_report()
    assert rep is not None and "no attention layer" in rep.reuse_off


def test_a_refusing_worker_turns_governed_reuse_off_audited_and_on_the_gauge(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's refusal reaches the scheduler side in its first report: one ``reuse_disabled``
    event naming the backend and setting, ``semgov:reuse_disabled`` 1; from then on no request is
    decided (not even against a donor registered before) and none saved, however many reports say it."""
    s = _make_side(tmp_path, monkeypatch, SEMGOV_ASYNC_DECISIONS="0")
    try:
        # NOTE: the gauge lives in the process's registry, which earlier tests may have set: start at 0.
        s.gov.metrics.reuse_disabled.set(0)
        p = pair_prompts("unit-reuse-off", e_len=512)
        _donor(s, p)  # NOTE: a donor registered before the report: it is never decided against
        rep = _worker(_caches(device="meta"), "FLEX_ATTENTION").take_report()
        assert rep is not None
        both = rep.aggregate(WorkerReport())  # NOTE: tensor parallel: any worker's refusal is kept
        s.output(NS(kv_connector_worker_meta=both))
        s.output(NS(kv_connector_worker_meta=rep))
        r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
        assert s.matched(r, 256) == (0, False)
        d = _req(p.donor, GW.token("acme", "ns", p.donor_segs))
        assert s.matched(d, 0) == (0, False)
        assert _step(s, d, 0, len(p.donor), _blocks(len(p.donor))).saves == []
        s.gov.wait_idle()
        audit = summarize(read_audit(s.audit_dir))  # type: ignore[attr-defined]
        off = [v for v in audit.violations if v["kind"] == "reuse_disabled"]
        assert len(off) == 1 and "FLEX_ATTENTION" in str(off[0]["detail"])
        assert "--attention-backend FLASH_ATTN" in str(off[0]["detail"])
        assert s.gov.metrics.reuse_disabled._value.get() == 1 and s.stats["decided"] == 0
    finally:
        s.close()
