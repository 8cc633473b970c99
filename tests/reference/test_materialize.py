"""The CPU reference engine: KV materialization from semgov decisions (engine_hooks.reference, blend).

Unit tests run on a tiny seeded random Llama and a tiny seeded random Qwen2 (with q/k/v biases), both
with the real SmolLM2 tokenizer; the tests marked
``model`` run on the real SmolLM2-135M-Instruct (converted from its GGUF on first use and
cached under ``$SEMGOV_MODEL_CACHE``, default ``~/.cache/semgov/models``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import DynamicCache

from engine_hooks.reference import blend
from engine_hooks.reference import materialize as mz
from engine_hooks.reference import model as mm
from engine_hooks.reference.model import LoadedModel, load_smollm2

C = mz.PREFILL_CHUNK_TOKENS
COMPANIES = ["Northwind Traders", "Contoso Ltd", "Fabrikam Inc", "Tailspin Toys", "Litware Corp", "Adatum"]
SYSTEM = (
    "<|im_start|>system\nYou are a careful financial analyst. Answer from the documents only.<|im_end|>\n"
)
GUIDE = (
    "Follow the house style: cite the quarter and the company for every figure, round to whole millions, "
    "never speculate beyond the documents, and flag any figure that looks inconsistent. "
)


def filings(lm: LoadedModel, tokens: int, seed: int) -> list[int]:
    """Deterministic filing prose, cut to ``tokens`` tokens."""
    r = random.Random(seed)
    ids: list[int] = []
    while len(ids) < tokens:
        para = (
            f"In the {r.choice(['first', 'second', 'third', 'fourth'])} quarter of {2017 + r.randint(0, 7)}, "
            f"{r.choice(COMPANIES)} reported revenue of {r.randint(100, 999)} million dollars, "
            f"up {r.randint(1, 30)} percent, while operating costs rose {r.randint(1, 20)} percent "
            f"to {r.randint(50, 600)} million. "
        )
        ids += enc(lm, para)
    return ids[:tokens]


def enc(lm: LoadedModel, text: str) -> list[int]:
    return list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


def span(rs: int, ds: int, length: int, kind: str) -> dict[str, Any]:
    return {"recipient_start": rs, "donor_start": ds, "length": length, "kind": kind}


def record(spans: list[dict[str, Any]], decision: str = "allow", **extra: Any) -> dict[str, Any]:
    return {"decision_id": "d" * 32, "decision": decision, "approved_spans": spans, **extra}


def same_cache(a: DynamicCache, b: DynamicCache) -> bool:
    return len(a.layers) == len(b.layers) and all(
        torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)
        for x, y in zip(a.layers, b.layers, strict=True)
    )


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: bit-exactness holds at any fixed thread count, and two threads on a busy
    2-core machine are many times slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2"])
def lm(request: pytest.FixtureRequest) -> LoadedModel:
    """Both architectures the reference engine runs: a tiny Llama and a tiny Qwen2 (q/k/v biases)."""
    return mm.load_model(str(request.param))


@pytest.fixture(scope="module")
def prompts(lm: LoadedModel) -> dict[str, list[int]]:
    """Donor [A][D][Q1]; question variant [A][D][Q2]; shifted [B][D][Q2] with B 80 tokens longer than A."""
    a = enc(lm, SYSTEM + "<|im_start|>user\nHere are the filings you asked about:\n\n")
    b = enc(lm, SYSTEM + "<|im_start|>user\nBackground notes, unrelated to the question.\n\n") + filings(
        lm, 80, 5
    )
    d = filings(lm, 400, 1)
    q1 = enc(lm, "\n\nWhat was Contoso's revenue?<|im_end|>\n<|im_start|>assistant\n")
    q2 = enc(lm, "\n\nHow did operating costs change?<|im_end|>\n<|im_start|>assistant\n")
    return {"a": a, "b": b, "d": d, "donor": a + d + q1, "question": a + d + q2, "shifted": b + d + q2}


@pytest.fixture(scope="module")
def donor(lm: LoadedModel, prompts: dict[str, list[int]]) -> mz.DonorKV:
    return mz.donor_kv(lm, prompts["donor"])


def common_prefix(x: list[int], y: list[int]) -> int:
    return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))


def shifted_spans(prompts: dict[str, list[int]]) -> list[dict[str, Any]]:
    a, b, d = prompts["a"], prompts["b"], prompts["d"]
    return [span(0, 0, common_prefix(a, b), "prefix"), span(len(b), len(a), len(d), "shifted")]


def test_prefix_exact_repeat_bitwise_equal_to_cold(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Exact repeat: copy the donor's KV, compute the last chunk: cold's logits and cache, bit for bit."""
    ids = prompts["donor"]
    cold = mz.cold_prefill(lm, ids)
    warm, ev = mz.warm_prefill(lm, ids, donor, [span(0, 0, len(ids), "prefix")], decision_id="x")
    assert torch.equal(warm.logits_last, cold.logits_last)
    assert same_cache(warm.cache, cold.cache)
    assert ev.materialized_tokens == (len(ids) - 1) // C * C > 0
    assert warm.computed_tokens == ev.prefilled_tokens == len(ids) - ev.materialized_tokens
    assert ev.recomputed_tokens == ev.prefilled_tokens  # the whole prompt is approved


def test_prefix_question_variant_bitwise_equal_to_cold(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Question variant: common prefix copied, the rest prefilled: cold's logits and cache, bit for bit."""
    ids = prompts["question"]
    p = common_prefix(ids, prompts["donor"])
    assert p >= len(prompts["a"]) + len(prompts["d"])
    cold = mz.cold_prefill(lm, ids)
    warm, ev = mz.warm_prefill(lm, ids, donor, [span(0, 0, p, "prefix")], decision_id="x")
    assert torch.equal(warm.logits_last, cold.logits_last)
    assert same_cache(warm.cache, cold.cache)
    assert ev.materialized_tokens == p // C * C
    assert ev.recomputed_tokens == p - ev.materialized_tokens  # the partial chunk at the prefix's end
    assert ev.prefilled_tokens == len(ids) - ev.materialized_tokens


def test_rerotate_keys_equals_keys_computed_at_shifted_positions(lm: LoadedModel) -> None:
    """Keys re-rotated by delta equal the keys the model computes at positions + delta (RoPE composes)."""
    ids = torch.tensor([filings(lm, 96, 3)])
    inv_freq = lm.model.model.rotary_emb.inv_freq
    with torch.no_grad():
        base = DynamicCache(config=lm.model.config)
        lm.model(input_ids=ids, past_key_values=base, use_cache=True)
        for delta in (5, 300, 3000):
            moved = DynamicCache(config=lm.model.config)
            lm.model(
                input_ids=ids,
                position_ids=torch.arange(delta, delta + 96)[None],
                past_key_values=moved,
                use_cache=True,
            )
            for x, y in zip(base.layers, moved.layers, strict=True):
                got = mz.rerotate_keys(x.keys, delta, inv_freq)
                assert (got - y.keys).abs().max() <= 1e-4 * y.keys.abs().max()
                assert (x.keys - y.keys).abs().max() > 0.1 * y.keys.abs().max()  # not re-rotating is wrong


# Tiny random model (init std 0.2; D = 400 tokens moved by 83 positions; 33 positions: the first
# token and 32 teacher-forced answer tokens). Measured: re-rotated with the default recompute
# (5%, at least 16) mean KL 0.034 nats, top-1 0.55; without re-rotation KL 0.58, top-1 0.18.
# Random weights give flat distributions (near-tied top logits), so top-1 is a weak signal here
# and its bound is loose; the KL gap (17x) is the point. The real-model test is tighter.
# tiny-qwen2 (hidden 128, biases): re-rotated KL 0.146, top-1 0.70; without re-rotation KL 1.61 (11x).
TINY_SHIFTED_KL = {"tiny": 0.1, "tiny-qwen2": 0.3}
TINY_SHIFTED_TOP1 = 0.4


def test_shifted_reuse_rerotated_within_bounds_and_better_than_without(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Shifted evidence ([A][D][Q] -> [B][D][Q']) re-rotated stays near cold; not re-rotated, far worse."""
    ids = prompts["shifted"]
    spans = shifted_spans(prompts)
    cold = mz.cold_prefill(lm, ids)
    answer = mz.greedy(lm, cold, 32)
    ref = mz.teacher_forced_logits(lm, cold, answer)
    results = {}
    for rotate in (True, False):
        warm, ev = mz._warm_prefill(
            lm,
            ids,
            donor,
            spans,
            decision_id="x",
            recompute_share=0.05,
            min_recompute=16,
            on_event=None,
            rerotate=rotate,
        )
        results[rotate] = mz.compare_logits(ref, mz.teacher_forced_logits(lm, warm, answer))
        assert ev.materialized_tokens == len(prompts["d"]) - 20  # ceil(5% of 400) = 20 recomputed
    kl, top1, _ = results[True]
    kl_raw, top1_raw, _ = results[False]
    assert lm.spec is not None
    assert kl < TINY_SHIFTED_KL[lm.spec.name] and top1 >= TINY_SHIFTED_TOP1, results
    assert kl_raw > 5 * kl and top1_raw < top1, results


def test_full_recompute_reproduces_cold(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """recompute_share=1.0 recomputes every shifted token: cold's logits within 1e-4."""
    ids = prompts["shifted"]
    cold = mz.cold_prefill(lm, ids)
    warm, ev = mz.warm_prefill(lm, ids, donor, shifted_spans(prompts), decision_id="x", recompute_share=1.0)
    assert (warm.logits_last - cold.logits_last).abs().max() <= 1e-4
    assert ev.materialized_tokens == 0 and ev.prefilled_tokens == len(ids)


def test_event_counts_and_callback(lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV) -> None:
    """The realization event has the decision id, spans and consistent counts, and reaches on_event once."""
    ids = prompts["shifted"]
    spans = shifted_spans(prompts)
    events: list[mz.Realization] = []
    warm, ev = mz.warm_prefill(
        lm,
        ids,
        donor,
        spans,
        decision_id="abc",
        recompute_share=0.1,
        min_recompute=16,
        on_event=events.append,
    )
    assert events == [ev]
    d = len(prompts["d"])
    assert ev.decision_id == "abc" and ev.spans == tuple(spans)
    assert (
        ev.materialized_tokens == d - 40
    )  # shifted: 10% of 400 recomputed; the short prefix is under a chunk
    assert ev.recomputed_tokens == spans[0]["length"] + 40
    assert ev.prefilled_tokens == warm.computed_tokens == len(ids) - ev.materialized_tokens
    assert ev.seconds == warm.seconds > 0
    # min_recompute wins over a small share; a span never recomputes more than its length
    _, ev = mz.warm_prefill(
        lm, ids, donor, spans[1:], decision_id="abc", recompute_share=0.0, min_recompute=16
    )
    assert ev.materialized_tokens == d - 16
    _, ev = mz.warm_prefill(lm, ids, donor, spans[1:], decision_id="abc", min_recompute=10_000)
    assert ev.materialized_tokens == 0 and ev.recomputed_tokens == d
    # the last position is computed even inside an approved shifted span
    tail = prompts["b"] + prompts["d"]
    planned = {**span(len(prompts["b"]), len(prompts["a"]), d, "shifted"), "recompute": 20}
    _, ev = mz.warm_prefill(lm, tail, donor, [planned], decision_id="t")
    assert ev.materialized_tokens == d - 20 - 1 and ev.recomputed_tokens == 21


def test_the_records_plan_is_followed_and_a_floor_only_adds(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Each span's signed recompute head is computed, not copied; the caller's floor never lowers it."""
    ids = prompts["shifted"]
    d = len(prompts["d"])
    plain = shifted_spans(prompts)[1:]
    planned = [{**plain[0], "recompute": 123}]
    _, ev = mz.warm_prefill(lm, ids, donor, plain, decision_id="p")
    assert ev.materialized_tokens == d  # no plan, no floor: the whole shifted span is copied
    _, ev = mz.warm_prefill(lm, ids, donor, planned, decision_id="p")
    assert ev.materialized_tokens == d - 123 and ev.spans == tuple(plain)  # the event lists the span itself
    _, ev = mz.warm_prefill(lm, ids, donor, planned, decision_id="p", recompute_share=0.05, min_recompute=16)
    assert ev.materialized_tokens == d - 123  # the floor (20) is below the plan
    _, ev = mz.warm_prefill(lm, ids, donor, planned, decision_id="p", recompute_share=0.5)
    assert ev.materialized_tokens == d - d // 2
    for bad in (-1, d + 1, True, 1.5):
        with pytest.raises(ValueError, match="recompute"):
            mz.warm_prefill(lm, ids, donor, [{**plain[0], "recompute": bad}], decision_id="p")


def invalid_cases(prompts: dict[str, list[int]]) -> dict[str, tuple[list[int], list[dict[str, Any]]]]:
    a, b, d = len(prompts["a"]), len(prompts["b"]), len(prompts["d"])
    q, s = prompts["question"], prompts["shifted"]
    return {
        "token mismatch": (s, [span(b - 5, a - 5, d, "shifted")]),
        "prefix outside the common prefix": (q, [span(0, 0, len(q), "prefix")]),
        "prefix at another position": (s, [span(b, a, d, "prefix")]),
        "prefix after other tokens": (list(reversed(prompts["a"])) + prompts["d"], [span(a, a, d, "prefix")]),
        "overlap": (s, [span(b, a, 200, "shifted"), span(b + 100, a + 100, 200, "shifted")]),
        "unsorted": (s, [span(b + 200, a + 200, 100, "shifted"), span(b, a, 100, "shifted")]),
        "beyond the recipient": (s, [span(len(s) - 10, a, 20, "shifted")]),
        "beyond the donor": (s, [span(b, a + d - 10, 400, "shifted")]),
        "negative start": (s, [span(-1, a, 10, "shifted")]),
        "zero length": (s, [span(b, a, 0, "shifted")]),
        "unknown kind": (s, [span(b, a, d, "approximate")]),
        "length not an int": (s, [{**span(b, a, d, "shifted"), "length": float(d)}]),
        "missing key": (s, [{"recipient_start": b, "donor_start": a, "length": d}]),
    }


def test_invalid_spans_raise_before_computing(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Token mismatch, overlap, out of range and malformed spans raise ValueError before the model runs."""

    def no_run(*_: Any) -> None:
        raise AssertionError("the model ran before the spans were validated")

    monkeypatch.setattr(mz, "_run", no_run)
    for name, (ids, spans) in invalid_cases(prompts).items():
        with pytest.raises(ValueError):
            mz.warm_prefill(lm, ids, donor, spans, decision_id=name)
    with pytest.raises(ValueError):
        mz.warm_prefill(
            lm, prompts["shifted"], donor, shifted_spans(prompts), decision_id="x", recompute_share=1.5
        )
    short = mz.DonorKV(donor.token_ids[:-1], donor.keys, donor.values)
    with pytest.raises(ValueError):
        mz.warm_prefill(lm, prompts["donor"], short, [span(0, 0, 100, "prefix")], decision_id="x")


def test_governed_prefill_falls_back_to_cold(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Deny, no record/donor/spans, bad spans, a record for another prompt, a failing sink: cold, no event."""
    ids = prompts["shifted"]
    cold = mz.cold_prefill(lm, ids)
    good = shifted_spans(prompts)
    events: list[mz.Realization] = []

    def broken_sink(_: mz.Realization) -> None:
        raise OSError("audit sink down")

    cases: list[tuple[mz.DonorKV | None, dict[str, Any] | None, dict[str, Any]]] = [
        (donor, record(good, decision="deny"), {}),
        (donor, None, {}),
        (None, record(good), {}),
        (donor, record([]), {}),
        (donor, {"decision": "allow", "approved_spans": good}, {}),  # no decision_id
        (donor, record(good, recipient_tokens=len(ids) + 1), {}),
        (donor, record(good), {"on_event": broken_sink}),
        (donor, record(good), {"recompute_share": -1.0}),
    ]
    # governed_prefill orders a record's spans by position itself (engines may list them in any order)
    cases += [
        (donor, record(spans), {})
        for name, (_, spans) in invalid_cases(prompts).items()
        if name != "unsorted"
    ]
    for d, rec, kw in cases:
        pre, ev = mz.governed_prefill(lm, ids, d, rec, **({"on_event": events.append} | kw))
        assert ev is None, rec
        assert torch.equal(pre.logits_last, cold.logits_last) and pre.computed_tokens == len(ids)
    assert events == []


def test_governed_prefill_materializes_on_allow(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """An allow record materializes its spans (in any listed order) under its decision id."""
    ids = prompts["question"]
    p = common_prefix(ids, prompts["donor"])
    spans = [span(0, 0, 100, "prefix"), span(100, 100, p - 100, "prefix")]
    events: list[mz.Realization] = []
    rec = record(list(reversed(spans)), recipient_tokens=len(ids))
    pre, ev = mz.governed_prefill(lm, ids, donor, rec, on_event=events.append)
    assert ev is not None and events == [ev]
    assert ev.decision_id == rec["decision_id"] and ev.spans == tuple(spans)
    assert ev.materialized_tokens == p // C * C
    assert torch.equal(pre.logits_last, mz.cold_prefill(lm, ids).logits_last)


def test_greedy_continues_identically_after_prefix_warm(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Greedy after a prefix-warm prefill equals greedy after a cold one, and leaves the prefill reusable."""
    ids = prompts["question"]
    cold = mz.cold_prefill(lm, ids)
    warm, _ = mz.warm_prefill(
        lm, ids, donor, [span(0, 0, common_prefix(ids, prompts["donor"]), "prefix")], decision_id="x"
    )
    out = mz.greedy(lm, cold, 24)
    assert len(out) == 24
    assert mz.greedy(lm, warm, 24) == out
    assert mz.greedy(lm, warm, 24) == out  # the prefill's cache was not consumed
    assert warm.cache.get_seq_length() == len(ids)
    assert mz.greedy(lm, cold, 24, stop_token_ids={out[3]}) == out[: out.index(out[3]) + 1]
    assert mz.greedy(lm, cold, 0) == []


def test_sha256_mismatch_names_the_file(tmp_path: Path) -> None:
    """A GGUF whose SHA-256 differs is refused with an error naming the file."""
    f = tmp_path / "model.gguf"
    f.write_bytes(b"not the model")
    with pytest.raises(ValueError, match="model.gguf"):
        mm.verify_sha256(f, mm.GGUF_SHA256)


def test_cache_is_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conversion that dies leaves no cache entry; a finished one is marked; the env var sets the root."""
    final = tmp_path / "x" / "model"

    def dies(d: Path) -> None:
        (d / "half.safetensors").write_bytes(b"partial")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        mm._write_atomically(final, "ab" * 32, dies)
    assert not final.exists() and list(final.parent.iterdir()) == []
    mm._write_atomically(final, "ab" * 32, lambda d: (d / "w").write_text("ok"))
    assert (final / "w").read_text() == "ok" and mm._cached(final, "ab" * 32)
    with pytest.raises(ValueError, match="remove it"):
        mm._cached(final, "cd" * 32)
    monkeypatch.setenv(mm.CACHE_ENV, str(tmp_path / "root"))
    assert mm.cache_dir_for("ab" * 32) == tmp_path / "root" / ("ab" * 8)
    assert mm.cache_dir_for("ab" * 32, tmp_path / "arg") == tmp_path / "arg" / ("ab" * 8)


# Real model (SmolLM2-135M-Instruct, float32, CPU, 1 thread): D = 400 tokens of filings moved 195
# positions behind a longer instruction wrapper; 33 positions (first token and 32 teacher-forced
# answer tokens). Measured: re-rotated with the default recompute (5%, at least 16) mean KL
# 0.0068 nats, top-1 1.0, greedy answer equal to cold; keys copied as they are with nothing
# recomputed: KL 0.040, top-1 0.94. Bounds: KL at about 4x the measured value (other CPUs round
# differently), top-1 0.9 (3 of 33 positions may flip), and at least 2x better than naive (6x).
# (When the new wrapper is itself evidence-like, other filings, KL is about 0.1 whatever the
# rotation: the donor's K/V were computed in another context; see benchmarks/materialize.py.)
MODEL_SHIFTED_KL = 0.03
MODEL_SHIFTED_TOP1 = 0.9


@pytest.fixture(scope="module")
def smollm2() -> LoadedModel:
    return load_smollm2()


@pytest.mark.model
def test_real_model_prefix_bitwise_and_shifted_within_bounds(smollm2: LoadedModel) -> None:
    """SmolLM2: prefix reuse on ~600 tokens equals cold bit for bit; shifted 400-token evidence near cold."""
    lm = smollm2
    a = enc(lm, SYSTEM + "<|im_start|>user\nHere are the filings you asked about:\n\n")
    b = enc(lm, SYSTEM + "<|im_start|>user\n" + GUIDE * 6 + "\n\n")  # a longer instruction wrapper
    d = filings(lm, 400, 7)
    q1 = enc(lm, "\n\nWhat was Contoso's revenue?<|im_end|>\n<|im_start|>assistant\n")
    q2 = enc(
        lm, "\n\nSummarize how operating costs changed for each company.<|im_end|>\n<|im_start|>assistant\n"
    )
    pad = filings(lm, 150, 11)  # a longer evidence block for the ~600-token prefix case
    donor_ids = a + pad + d + q1
    donor = mz.donor_kv(lm, donor_ids)

    ids = a + pad + d + q2
    p = common_prefix(ids, donor_ids)
    cold = mz.cold_prefill(lm, ids)
    warm, ev = mz.warm_prefill(lm, ids, donor, [span(0, 0, p, "prefix")], decision_id="q")
    assert len(ids) >= 600 and ev.materialized_tokens == p // C * C >= 512
    assert torch.equal(warm.logits_last, cold.logits_last)
    assert same_cache(warm.cache, cold.cache)

    donor_ids = a + d + q1
    donor = mz.donor_kv(lm, donor_ids)
    ids = b + d + q2
    cold = mz.cold_prefill(lm, ids)
    answer = mz.greedy(lm, cold, 32)
    ref = mz.teacher_forced_logits(lm, cold, answer)
    spans = [span(0, 0, common_prefix(a, b), "prefix"), span(len(b), len(a), len(d), "shifted")]
    planned = [spans[0], {**spans[1], "recompute": 20}]  # NOTE: the default policy's plan for 400 tokens
    warm, ev = mz.warm_prefill(lm, ids, donor, planned, decision_id="s")
    assert ev.materialized_tokens == len(d) - 20
    kl, top1, _ = mz.compare_logits(ref, mz.teacher_forced_logits(lm, warm, answer))
    naive, _ = mz._warm_prefill(
        lm,
        ids,
        donor,
        spans,
        decision_id="s",
        recompute_share=0.0,
        min_recompute=0,
        on_event=None,
        rerotate=False,
    )
    kl_naive, _, _ = mz.compare_logits(ref, mz.teacher_forced_logits(lm, naive, answer))
    assert kl < MODEL_SHIFTED_KL and top1 >= MODEL_SHIFTED_TOP1, (kl, top1, kl_naive)
    assert 2 * kl < kl_naive, (kl, kl_naive)


# ---- selective recompute (engine_hooks.reference.blend) -------------------------------------


def _blend_planned(prompts: dict[str, list[int]], head: int) -> list[dict[str, Any]]:
    spans = shifted_spans(prompts)
    return [{**spans[0], "recompute": 0}, {**spans[1], "recompute": head}]


def test_selective_recompute_of_every_token_is_a_cold_prefill(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Selective, recompute = the whole shifted span: cold's logits and cache, to float order."""
    ids = prompts["shifted"]
    cold = mz.cold_prefill(lm, ids)
    d = len(prompts["d"])
    pre, ev = blend.blend_prefill(lm, ids, donor, _blend_planned(prompts, d), decision_id="b")
    assert ev.materialized_tokens == shifted_spans(prompts)[0]["length"]  # only the exact prefix is copied
    assert torch.allclose(pre.logits_last, cold.logits_last, atol=1e-4, rtol=0)
    for x, y in zip(pre.cache.layers, cold.cache.layers, strict=True):
        assert torch.allclose(x.keys, y.keys, atol=1e-4, rtol=0)
        assert torch.allclose(x.values, y.values, atol=1e-4, rtol=0)


def test_selective_recompute_computes_the_planned_count_and_copies_the_rest(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Selective: the planned count of span tokens computed (chosen by deviation), the rest copied as is."""
    ids = prompts["shifted"]
    spans = shifted_spans(prompts)
    p, d = spans[0]["length"], len(prompts["d"])
    rs, ds = spans[1]["recipient_start"], spans[1]["donor_start"]
    pre, ev = blend.blend_prefill(lm, ids, donor, _blend_planned(prompts, 40), decision_id="b")
    assert ev.materialized_tokens == p + d - 40 and ev.recomputed_tokens == 40
    assert pre.computed_tokens == ev.prefilled_tokens == len(ids) - ev.materialized_tokens
    inv = mz.rotation(lm)
    kept = 0
    for pos in range(d):  # NOTE: a copied position holds exactly the donor's re-rotated K/V
        got = pre.cache.layers[-1].keys[0, :, rs + pos]
        want = mz.rerotate_keys(donor.keys[-1][:, ds + pos : ds + pos + 1], rs - ds, inv)[:, 0]
        kept += bool(torch.equal(got, want))
    assert kept == d - 40
    none, ev0 = blend.blend_prefill(lm, ids, donor, _blend_planned(prompts, 0), decision_id="b")
    lead, _ = mz.warm_prefill(lm, ids, donor, _blend_planned(prompts, 0), decision_id="b")
    assert ev0.recomputed_tokens == 0 and torch.allclose(none.logits_last, lead.logits_last, atol=1e-4)


def test_selective_recompute_checks_spans_as_a_leading_one_does(
    lm: LoadedModel, prompts: dict[str, list[int]], donor: mz.DonorKV
) -> None:
    """Selective: a span whose tokens differ, or a plan beyond its span, is refused before anything runs."""
    ids = prompts["shifted"]
    bad = _blend_planned(prompts, 0)
    bad[1] = {**bad[1], "donor_start": bad[1]["donor_start"] + 1}
    with pytest.raises(ValueError, match="tokens differ"):
        blend.blend_prefill(lm, ids, donor, bad, decision_id="b")
    with pytest.raises(ValueError, match="recompute"):
        blend.blend_prefill(lm, ids, donor, _blend_planned(prompts, len(prompts["d"]) + 1), decision_id="b")
