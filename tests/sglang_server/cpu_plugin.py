"""The rig's SGLang general plugin (test-only; never part of the product's ``semgov`` entry point).

The rig (:mod:`tests.sglang_server.rig`) declares it through a generated ``*.dist-info`` on the
server's ``PYTHONPATH``; SGLang runs it in the launcher, the scheduler and the detokenizer.

- :func:`register` (on a CPU server: ``SEMGOV_RIG_DEVICE=cpu``, the rig's default) sets
  ``sglang.srt.layers.rotary_embedding.base._is_mps = True`` before models are built: on a
  platform SGLang does not recognise (a plain CPU), ``RotaryEmbedding.__init__`` would otherwise
  import a fallback kernel from ``vllm._custom_ops``; with the flag set the
  forward uses ``forward_native`` (../shared/RECIPES.md, "A real SGLang server on CPU").
- With ``SEMGOV_RIG_KV_DUMP=DIR``, it wraps two methods of the governed cache (through SGLang's
  ``HookRegistry``: its realizer's ``Realizer.realized`` and ``GovernedRadixCache.on_release``)
  to write, for requests whose ``rid`` starts with ``kvdump-``, the K/V of every layer to ``DIR``
  with ``torch.save``: right after a realization (the recipient's realized slots and the donor
  slots they were copied from, with the pieces), and at release (the request's whole row, before
  it is freed). A test then compares them with a cold prefill's.
- With ``SEMGOV_RIG_DONOR_LOG=FILE``, it appends ``s`` to ``FILE`` for every donor the hook
  queues for registration and ``r`` when its registration is done (in the decision process or on
  the registration thread: ``DonorRegistry.registration_done``), so the rig
  can wait for registrations deterministically (:func:`tests.sglang_server.rig.settle`).
- With ``SEMGOV_RIG_SCHED_LOG=FILE``, it appends one line per finished request the hook
  tracked: semgov's scheduler-thread nanoseconds for it (``ReqState.sched_ns``), and the seconds
  from queueing its decision to taking it and to letting it through, for the benchmarks.
- With ``SEMGOV_RIG_TP_FOLLOWER_FORGETS=1``, tensor-parallel ranks other than 0 forget finished
  requests (a fault: the leader's registry can no longer be replayed there).
- With ``SEMGOV_RIG_DEGRADE_TASK=ID``, every realization for a request of that task id is
  degraded right after it is copied: the realized slots' values are overwritten with a large
  constant in every layer (a fault for the canary test: a realization that changes answers, as a
  bad re-rotation or copy would; zeros were not enough for a random one-layer model, whose tied
  embeddings dominate its logits).
- :func:`permissive_minhash` is the rig's candidate provider (``SEMGOV_PROVIDER``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DUMP_PREFIX = "kvdump-"


def permissive_minhash(**kwargs: Any) -> Any:
    """MinHash proposing every same-scope donor (``min_similarity=0``), so deny paths run too."""
    from engine_hooks.core.providers.minhash import MinHashProvider

    return MinHashProvider(min_similarity=0.0, **kwargs)


def register() -> None:
    if os.environ.get("SEMGOV_RIG_DEVICE", "cpu") == "cpu":
        import sglang.srt.layers.rotary_embedding.base as rope_base

        rope_base._is_mps = True
    dump = os.environ.get("SEMGOV_RIG_KV_DUMP", "").strip()
    if dump:
        _install_kv_dump(Path(dump))
    donor_log = os.environ.get("SEMGOV_RIG_DONOR_LOG", "").strip()
    if donor_log:
        _install_donor_log(Path(donor_log))
    sched_log = os.environ.get("SEMGOV_RIG_SCHED_LOG", "").strip()
    if sched_log:
        _install_sched_log(Path(sched_log))
    if os.environ.get("SEMGOV_RIG_TP_FOLLOWER_FORGETS") == "1":
        _install_follower_forgets()
    degrade = os.environ.get("SEMGOV_RIG_DEGRADE_TASK", "").strip()
    if degrade:
        _install_degrade(degrade)


def _install_degrade(task_id: str) -> None:
    """Overwrite the realized slots' values (every layer) of realizations for requests of ``task_id``."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def after_realized(
        result: Any, realizer: Any, st: Any, req: Any, slots: Any, pieces: Any, decision_id: str, where: str
    ) -> Any:
        if st.context is not None and st.context.task.get("id") == task_id:
            import torch

            pool = realizer.tree.kv_pool
            s = slots.to(torch.int64).to(pool.device)
            for layer in range(pool.start_layer, pool.start_layer + pool.layer_num):
                pool.get_value_buffer(layer)[s] = 100.0
        return result

    HookRegistry.register("engine_hooks.sglang.realize.Realizer.realized", after_realized, HookType.AFTER)


def _install_follower_forgets() -> None:
    """A fault for the TP divergence test: non-leader ranks drop every finished request instead
    of keeping it as a donor, so the leader's next registration finds no copy there (forgotten)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def forget(original: Any, gov: Any, spec: Any) -> None:
        return None

    HookRegistry.register("engine_hooks.sglang.tp.FollowerGovernor.submit_donor", forget, HookType.AROUND)


def _install_sched_log(path: Path) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def after_release(result: Any, cache: Any, req: Any, *, checkpointed: bool) -> Any:
        st = getattr(req, "_semgov_state", None)
        if st is not None and req.finished() and not _rank(cache):  # NOTE: rank 0's only
            with path.open("a") as f:
                f.write(f"{st.sched_ns} {st.decided_s:.6f} {st.held_s:.6f}\n")
        return result

    HookRegistry.register(
        "engine_hooks.sglang.cache.GovernedRadixCache.on_release", after_release, HookType.AFTER
    )


def _install_donor_log(path: Path) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    def mark(c: bytes) -> None:
        with path.open("ab") as f:  # one byte per write: appends from two threads never interleave
            f.write(c)

    def before_submit(gov: Any, spec: Any) -> None:
        mark(b"s")

    def after_registration(result: Any, donors: Any, donor_id: str, registered: bool) -> Any:
        mark(b"r")
        return result

    HookRegistry.register("engine_hooks.core.governor.Governor.submit_donor", before_submit, HookType.BEFORE)
    HookRegistry.register(
        "engine_hooks.core.donors.DonorRegistry.registration_done", after_registration, HookType.AFTER
    )


def _layers(pool: Any, slots: Any) -> dict[str, Any]:
    import torch

    ids = range(pool.start_layer, pool.start_layer + pool.layer_num)
    s = slots.to(torch.int64).to(pool.device)
    return {
        "k": [pool.get_key_buffer(i).index_select(0, s).float().cpu() for i in ids],
        "v": [pool.get_value_buffer(i).index_select(0, s).float().cpu() for i in ids],
    }


def _save(directory: Path, name: str, data: dict[str, Any]) -> None:
    import torch

    tmp = directory / f".{name}.tmp"
    torch.save(data, tmp)
    os.replace(tmp, directory / name)


def _rank(cache: Any) -> str:
    """A dump file's rank tag: none on rank 0 (or without TP), ``.rank1`` etc. on the others."""
    tp = getattr(cache, "tp", None)
    return f".rank{tp.rank}" if tp is not None and tp.rank else ""


def _install_kv_dump(directory: Path) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    directory.mkdir(parents=True, exist_ok=True)
    target = "engine_hooks.sglang.cache.GovernedRadixCache"

    def after_realized(
        result: Any, realizer: Any, st: Any, req: Any, slots: Any, pieces: Any, decision_id: str, where: str
    ) -> Any:
        cache = realizer.tree
        rid = str(req.rid)
        if rid.startswith(DUMP_PREFIX):
            data = {
                "rid": rid,
                "tokens": [int(t) for t in req.origin_input_ids],
                "pieces": [p.as_span() for p in pieces],
                "where": where,
                "recipient": _layers(cache.kv_pool, slots),
                "donor": _layers(cache.kv_pool, st.src_slots),
                "donor_id": st.donor.donor_id,
            }
            _save(directory, f"{rid}{_rank(cache)}.realized.{st.realizations}.pt", data)
        return result

    def before_release(cache: Any, req: Any, *, checkpointed: bool) -> Any:
        rid = str(req.rid)
        if rid.startswith(DUMP_PREFIX) and req.kv.holds_kv:
            n = int(req.kv.kv_committed_len)
            row = cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :n]
            data = {
                "rid": rid,
                "tokens": [int(t) for t in req.origin_input_ids],
                "row": _layers(cache.kv_pool, row),
            }
            _save(directory, f"{rid}{_rank(cache)}.release.pt", data)
        return None

    HookRegistry.register("engine_hooks.sglang.realize.Realizer.realized", after_realized, HookType.AFTER)
    HookRegistry.register(f"{target}.on_release", before_release, HookType.BEFORE)
