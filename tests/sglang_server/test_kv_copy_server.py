"""What a realization copies, read back from a real SGLang server's KV pool and compared with a cold prefill.

The rig's test plugin dumps, for ``kvdump-*`` requests, the K/V of every layer right after a
realization (the recipient's realized slots and the donor slots they came from) and at release
(the request's whole row). The server runs the tiny Llama in float32 with SGLang's own RoPE
(``forward_native``), plain and llama3-scaled (the backend then takes the frequencies from the
model's own rotary embedding). Donor ``[S][I][E][Q1]``, recipient ``[S][E][Q2]``: E is realized as a
shifted span (shift ``-len(I)``), and its cold arm is the same recipient in a scope no donor
reaches, primed with ``[S]``.

- Layer 0's K/V of a token depend only on the token and its position, so the realized E must
  equal what the cold prefill wrote there (K after re-rotation to the new positions, within
  float32 tolerance; V exactly as computed from the same token). This holds SGLang's real RoPE
  against the hook's re-rotation.
- On every layer, the realized V is the donor's V bit for bit and the realized K is the donor's K
  re-rotated by the shift (deeper layers legitimately differ from cold: the donor computed them
  in its own context; that is what the policy decides about).
- The recipient's row at release holds exactly the realized K/V at E's positions (the forward
  wrote only the positions after them) and the exact-prefix ``[S]`` equals the cold arm's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.sglang.rope import rope_from_rotary_embedding
from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import Server, pair_prompts, read_audit, settle, summarize


@pytest.fixture(params=["page1-overlap", "llama3-rope", "tp2"])
def server(servers: Any, request: pytest.FixtureRequest) -> Server:
    """Float32, with the rig's KV dump: plain or llama3 RoPE, and two tensor-parallel ranks."""
    srv: Server = servers(request.param)
    return srv


def _rank_tags(server: Server) -> list[str]:
    """The dump files' rank tags: rank 0 only, or with ``--tp-size 2`` each rank's own shard."""
    return ["", ".rank1"] if "--tp-size" in server.config.extra_args else [""]


def _rope(server: Server) -> RopeSpec:
    """The served model's RoPE as SGLang builds it: plain from the config, llama3 from SGLang's own
    rotary embedding class (built here on CPU the way the model builds it)."""
    import importlib

    import torch

    cfg = json.loads((server.config.model / "config.json").read_text())
    plain = RopeSpec(
        rotary_dim=cfg["head_dim"], head_dim=cfg["head_dim"], base=cfg["rope_theta"], is_neox_style=True
    )
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        return plain
    from transformers import LlamaConfig

    from tests.sglang_hook import conftest as _stubs  # noqa: F401 - the torchvision stub on sys.path

    importlib.import_module("sglang.srt.layers.rotary_embedding.base")._is_cpu = True
    get_rope = importlib.import_module("sglang.srt.layers.rotary_embedding").get_rope
    emb = get_rope(
        cfg["head_dim"],
        cfg["head_dim"],
        cfg["max_position_embeddings"],
        cfg["rope_theta"],
        rope_scaling=scaling,
        dtype=torch.float32,
    )
    spec = rope_from_rotary_embedding(LlamaConfig(**cfg), emb)
    assert spec is not None and spec.scaling == scaling["rope_type"] and spec != plain
    return spec


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ``|a - b| / |b|`` (Frobenius)."""
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize(
    ("wrapper", "where"), [(0, "front"), (96, "region at 352")], ids=["front", "after-new-wrapper"]
)
def test_realized_kv_equals_cold_prefill_after_rerotation(server: Server, wrapper: int, where: str) -> None:
    """Layer-0 K/V of realized tokens equal a cold prefill's; every layer is the donor's, re-rotated.

    ``front``: recipient ``[S][E][Q2]`` (E loaded at admission); ``after-new-wrapper``:
    ``[S][W'][E][Q2]`` with a new 96-token instruction, so E follows fresh tokens and is written
    into the row between two prefill chunks."""
    gw = server.gateway
    p = pair_prompts(f"kv-correctness-{wrapper}", e_len=1024, wrapper=wrapper)
    ns, cold_ns = f"ns-kv-{wrapper}", f"ns-kv-{wrapper}-cold"
    assert server.generate(
        p.primer, rid=f"kvdump-{wrapper}-primer", extra_key=gw.token("acme", cold_ns, p.primer_segs)
    ).ok
    cold = server.generate(
        p.recipient, rid=f"kvdump-{wrapper}-cold", extra_key=gw.token("acme", cold_ns, p.recipient_segs)
    )
    donor = server.generate(
        p.donor, rid=f"kvdump-{wrapper}-donor", extra_key=gw.token("acme", ns, p.donor_segs)
    )
    settle(server)
    warm = server.generate(
        p.recipient, rid=f"kvdump-{wrapper}-warm", extra_key=gw.token("acme", ns, p.recipient_segs)
    )
    assert cold.ok and donor.ok and warm.ok, (cold.error, donor.error, warm.error)
    audit = summarize(read_audit(server.files.audit_dir))
    assert audit.realized.get(f"kvdump-{wrapper}-warm") == p.evidence_len

    rope = _rope(server)
    if rope.scaling != "default":  # the backend took the scaled RoPE from the served model itself
        assert f"re-rotated ({rope.scaling} RoPE)" in server.log_text()
    shards = [_check_rank(server, tag, wrapper, where, p, rope) for tag in _rank_tags(server)]
    if len(shards) == 2:
        # NOTE: each rank copied its own shard: half of the model's KV heads. (With dummy weights
        # both ranks' projections are initialised from the same seed, so the values match too.)
        heads = json.loads((server.config.model / "config.json").read_text())["num_key_value_heads"]
        assert [tuple(k.shape[1:]) for k in shards] == [(heads // 2, k.shape[2]) for k in shards]
    assert_healthy(server)


def _check_rank(server: Server, tag: str, wrapper: int, where: str, p: Any, rope: RopeSpec) -> torch.Tensor:
    """One rank's dumps: realized K/V against its cold prefill and its donor (see the module
    docstring). Returns the rank's realized layer-0 keys."""
    d = server.kv_dump_dir
    realized = torch.load(d / f"kvdump-{wrapper}-warm{tag}.realized.1.pt")
    warm_row = torch.load(d / f"kvdump-{wrapper}-warm{tag}.release.pt")["row"]
    cold_row = torch.load(d / f"kvdump-{wrapper}-cold{tag}.release.pt")["row"]
    (piece,) = realized["pieces"]
    assert realized["where"].startswith(where), realized["where"]
    start, n = piece["recipient_start"], piece["length"]
    assert (piece["kind"], start, n) == ("shifted", p.evidence_start, p.evidence_len)
    shift = piece["recipient_start"] - piece["donor_start"]
    assert shift == wrapper - 64  # len(W') - len(I): E moved by the difference
    delta = torch.full((n,), shift, dtype=torch.int64)

    # Layer 0 against the cold prefill: SGLang's own RoPE at the new positions. (Dummy weights are
    # tiny, so every comparison is relative to the tensor's own scale; the cold arm ran in other
    # chunks and batches, so its float32 matmuls round differently: measured ~1e-4.)
    k0, v0 = realized["recipient"]["k"][0], realized["recipient"]["v"][0]
    assert _rel(k0, cold_row["k"][0][start : start + n]) < 1e-3
    assert _rel(v0, cold_row["v"][0][start : start + n]) < 1e-3
    # Not vacuous: the donor's own layer-0 keys sit at other positions and differ from cold.
    assert _rel(realized["donor"]["k"][0], cold_row["k"][0][start : start + n]) > 0.1
    # And the tolerance tells positions apart: keys rotated one position too far miss by far more.
    off_by_one = rerotate_keys(realized["donor"]["k"][0], delta + 1, rope)
    assert _rel(off_by_one, cold_row["k"][0][start : start + n]) > 1e-2

    for layer, (rk, rv, dk, dv) in enumerate(
        zip(
            realized["recipient"]["k"],
            realized["recipient"]["v"],
            realized["donor"]["k"],
            realized["donor"]["v"],
            strict=True,
        )
    ):
        assert torch.equal(rv, dv), layer
        assert _rel(rk, rerotate_keys(dk, delta, rope)) < 1e-6, layer
        # The row at release still holds the realized K/V at E's positions.
        assert torch.equal(warm_row["k"][layer][start : start + n], rk), layer
        assert torch.equal(warm_row["v"][layer][start : start + n], rv), layer
        # The exact prefix [S] is SGLang's own, identical to the cold arm's.
        assert _rel(warm_row["k"][layer][:start], cold_row["k"][layer][:start]) < 1e-3, layer
        assert _rel(warm_row["v"][layer][:start], cold_row["v"][layer][:start]) < 1e-3, layer
    return k0
