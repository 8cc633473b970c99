"""Learning where an attention kernel keeps a token's K/V in a block (engine_hooks.vllm.layout), from
synthetic writers here and from vLLM's own CPU kernel; and the connector's start-up refusals. What
needs vLLM runs once, in vLLM's environment (one interpreter start: importing vLLM costs ~12 s)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_hooks.vllm.layout import LayoutError, learn_layout
from tests.vllm.rig import require_vllm_python

ROOT = Path(__file__).resolve().parents[2]
BS, KVH, HD = 32, 2, 16


def _transposed_k(
    key: torch.Tensor, value: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor
) -> None:
    """Keys dimension-major inside a block, values token-major (what vLLM's AVX-512 kernel does)."""
    bs = kc.shape[2]
    for i, s in enumerate(slots.tolist()):
        b, o = divmod(s, bs)
        for h in range(key.shape[1]):
            kc[b, h].reshape(-1).view(key.shape[2], bs)[:, o] = key[i, h]  # NOTE: kc[b, h] is contiguous
            vc[b, h, o] = value[i, h]


def _plain(
    key: torch.Tensor, value: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor
) -> None:
    bs = kc.shape[2]
    for i, s in enumerate(slots.tolist()):
        b, o = divmod(s, bs)
        kc[b, :, o] = key[i]
        vc[b, :, o] = value[i]


@pytest.mark.parametrize("writer", [_plain, _transposed_k])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gather_and_scatter_round_trip_what_the_writer_wrote(writer: object, dtype: torch.dtype) -> None:
    """For a plain and a transposed-key kernel: gather returns exactly the K/V written at any slots,
    and scatter writes a cache identical to the kernel's."""
    layout = learn_layout(writer, dtype, BS, KVH, HD)  # type: ignore[arg-type]
    cache = torch.zeros(4, KVH, BS, 2 * HD, dtype=dtype)
    kc, vc = cache.view(4, KVH, 2 * BS, HD).chunk(2, dim=2)
    slots = torch.randperm(4 * BS)[:50]
    key, value = torch.randn(50, KVH, HD).to(dtype), torch.randn(50, KVH, HD).to(dtype)
    writer(key, value, kc, vc, slots)  # type: ignore[operator]
    got = layout.gather(cache, slots)
    assert torch.equal(got[:, 0], key) and torch.equal(got[:, 1], value)
    again = torch.zeros_like(cache)
    layout.scatter(again, slots, got)
    assert torch.equal(again, cache)


def _drops_a_dim(
    key: torch.Tensor, value: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor
) -> None:
    _plain(key, value, kc, vc, slots)
    kc[1, :, :, 0] = -1.0  # the kernel "forgets" dimension 0 of every key


def _spills(
    key: torch.Tensor, value: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor
) -> None:
    _plain(key, value, kc, vc, slots)
    kc[0, 0, 0, 0] = 1.0  # writes into a block it was not given


@pytest.mark.parametrize("writer", [_drops_a_dim, _spills])
def test_a_kernel_that_is_not_a_bijection_is_refused(writer: object) -> None:
    """A writer that loses elements or writes outside its block: LayoutError (then nothing is reused)."""
    with pytest.raises(LayoutError):
        learn_layout(writer, torch.float32, BS, KVH, HD)  # type: ignore[arg-type]


def test_quantized_caches_are_refused() -> None:
    """An 8-bit cache dtype is refused before any write."""
    with pytest.raises(LayoutError, match="quantized"):
        learn_layout(_plain, torch.float8_e4m3fn, BS, KVH, HD)


SCRIPT = """
import torch
from engine_hooks.vllm.layout import cpu_cache_writer, learn_layout
for dtype in (torch.bfloat16, torch.float32):
    bs, kvh, hd = 128, 2, 64
    w = cpu_cache_writer(dtype, bs, hd, "auto")
    lay = learn_layout(w, dtype, bs, kvh, hd)
    cache = torch.zeros(6, kvh, bs, 2 * hd, dtype=dtype)
    kc, vc = cache.view(6, kvh, bs * 2, hd).chunk(2, dim=2)
    slots = torch.randperm(6 * bs)[:300]
    key, val = torch.randn(300, kvh, hd).to(dtype), torch.randn(300, kvh, hd).to(dtype)
    w(key, val, kc, vc, slots)
    got = lay.gather(cache, slots)
    assert torch.equal(got[:, 0], key) and torch.equal(got[:, 1], val), dtype
    again = torch.zeros_like(cache)
    lay.scatter(again, slots, got)
    assert torch.equal(again, cache), dtype
print("LAYOUT-OK")

from types import SimpleNamespace as N
from engine_hooks.core.settings import HookConfigError
from engine_hooks.vllm.connector import _check_config
for policy in ("fail", None):
    try:
        _check_config(N(kv_transfer_config=N(kv_load_failure_policy=policy)), None)
    except HookConfigError as e:
        print("REFUSED:", e)
try:
    _check_config(N(kv_transfer_config=N(kv_load_failure_policy="recompute")), N(kv_cache_groups=[1, 2]))
except HookConfigError as e:
    print("REFUSED:", e)
_check_config(N(kv_transfer_config=N(kv_load_failure_policy="recompute")), N(kv_cache_groups=[1]))
print("ACCEPTED")

from pathlib import Path
from semgov.facts.pii import PiiScanner
from semgov.policy.source import load_policy_source, make_engine
for d in ("policies/rego/default", "policies/default"):
    make_engine(load_policy_source(Path(d)))
    print("POLICY-OK", d)
found = PiiScanner().scan("write to jane.doe@example.com", donor_token_hash="t", min_score=0.5)
print("PII", sorted(found))
"""


@pytest.fixture(scope="module")
def in_vllm() -> Any:
    """stdout of :data:`SCRIPT` run in vLLM's environment."""
    proc = subprocess.run(
        [str(require_vllm_python()), "-c", SCRIPT], cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    return proc.stdout, proc.stderr[-3000:]


def test_vllms_cpu_kernel_layout_is_learned_and_round_trips(in_vllm: Any) -> None:
    """vLLM 0.32's own CPU cache writer (the ISA this machine selects), bf16 and fp32: the learned
    layout reads back exactly what the kernel wrote at 300 random slots and writes it identically."""
    out, err = in_vllm
    assert "LAYOUT-OK" in out, err


def test_a_failing_load_policy_or_a_hybrid_model_is_refused_with_a_clear_message(in_vllm: Any) -> None:
    """kv_load_failure_policy other than "recompute" (a failed load would fail the request instead of
    running it cold) and a model with two KV cache groups are refused, naming the setting."""
    out, err = in_vllm
    lines = [ln for ln in out.splitlines() if ln.startswith(("REFUSED", "ACCEPTED"))]
    assert len(lines) == 4, out + err
    assert lines[0].count('"kv_load_failure_policy": "recompute"') == 1 and "'fail'" in lines[0]
    assert "None" in lines[1] and "has 2" in lines[2]
    assert lines[3] == "ACCEPTED"


def test_the_shipped_policies_and_the_pii_scan_run_in_vllms_environment(in_vllm: Any) -> None:
    """vLLM's engine core runs semgov's whole core: both shipped default policies (Rego through
    embedded regorus, YAML) load and compile there, and Presidio's offline scan finds an email."""
    out, err = in_vllm
    assert "POLICY-OK policies/rego/default" in out and "POLICY-OK policies/default" in out, out + err
    pii = [ln for ln in out.splitlines() if ln.startswith("PII ")]
    assert len(pii) == 1 and "'EMAIL_ADDRESS'" in pii[0], out + err
