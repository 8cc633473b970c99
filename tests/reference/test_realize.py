"""Realizations of shifted spans (engine_hooks.reference.realize) and the study that compares them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_hooks.reference import blend, realize
from engine_hooks.reference import materialize as mz
from engine_hooks.reference import model as mm
from tests.conftest import ROOT

SPANS = [
    {"recipient_start": 0, "donor_start": 0, "length": 40, "kind": "prefix", "recompute": 0},
    {"recipient_start": 70, "donor_start": 60, "length": 300, "kind": "shifted", "recompute": 60},
]


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("none", realize.Method("none")),
        ("leading:20%", realize.Method("leading:20%", head_percent=20)),
        ("leading:32", realize.Method("leading:32", head_tokens=32)),
        ("boundary:16", realize.Method("boundary:16", head_tokens=16)),
        ("trailing:128", realize.Method("trailing:128", tail_tokens=128)),
        ("trailing:25%", realize.Method("trailing:25%", tail_percent=25)),
        ("bookend:16+256", realize.Method("bookend:16+256", head_tokens=16, tail_tokens=256)),
        ("selective:20%", realize.Method("selective:20%", selective_percent=20)),
    ],
)
def test_names_parse(name: str, want: realize.Method) -> None:
    """Every documented form parses to its head, tail or selective share."""
    assert realize.parse(name) == want


@pytest.mark.parametrize("bad", ["", "leading", "trailing:-1", "selective:20", "blend:20%"])
def test_bad_names_are_refused_listing_the_forms(bad: str) -> None:
    """An unknown or malformed name is a ValueError that lists the forms; a percent over 100 says so."""
    with pytest.raises(ValueError, match="bookend:H\\+T"):
        realize.parse(bad)
    with pytest.raises(ValueError, match="a percent above 100"):
        realize.parse("leading:150%")


def test_plan_ends_the_span_early_for_a_tail_and_states_the_head() -> None:
    """bookend:16+100 on a 300-token shifted span: 200 tokens approved, the first 16 recomputed; the
    span's own signed recompute is replaced; the prefix span is kept whole; a plan with nothing left
    to copy drops the span; only selective is beyond what serving engines can do."""
    got = realize.plan(SPANS, realize.parse("bookend:16+100"))
    assert got == [SPANS[0], {**SPANS[1], "length": 200, "recompute": 16}]
    assert realize.plan(SPANS, realize.parse("trailing:300")) == [SPANS[0]]
    assert realize.plan(SPANS, realize.parse("none"))[1]["recompute"] == 0
    assert realize.plan(SPANS, realize.parse("selective:20%"))[1] == {**SPANS[1], "recompute": 60}
    assert realize.parse("trailing:64").realizable_by_serving_engines
    assert not realize.parse("selective:20%").realizable_by_serving_engines


@pytest.fixture(scope="module")
def case() -> tuple[mm.LoadedModel, list[int], mz.DonorKV, list[dict[str, Any]]]:
    """tiny-qwen2: donor [S][I][E][Q1], recipient [S][W][E][Q2] with W longer than I."""
    torch.set_num_threads(1)
    lm = mm.load_model("tiny-qwen2")
    g = torch.Generator().manual_seed(1)

    def block(n: int) -> list[int]:
        return [int(x) for x in torch.randint(100, 40_000, (n,), generator=g)]

    s, i, w, e, q1, q2 = block(40), block(30), block(60), block(300), block(20), block(20)
    donor = mz.donor_kv(lm, s + i + e + q1)
    spans = [
        {"recipient_start": 0, "donor_start": 0, "length": 40, "kind": "prefix"},
        {"recipient_start": 100, "donor_start": 70, "length": 300, "kind": "shifted"},
    ]
    return lm, s + w + e + q2, donor, spans


def test_a_tail_is_the_warm_prefill_of_the_shorter_span(
    case: tuple[mm.LoadedModel, list[int], mz.DonorKV, list[dict[str, Any]]],
) -> None:
    """trailing:128 is exactly warm_prefill over the span less its last 128 tokens: bit for bit."""
    lm, ids, donor, spans = case
    pre, ev = realize.realize(lm, ids, donor, spans, realize.parse("trailing:128"), decision_id="t")
    short = [{**spans[0], "recompute": 0}, {**spans[1], "length": 172, "recompute": 0}]
    ref, ref_ev = mz.warm_prefill(lm, ids, donor, short, decision_id="t")
    assert torch.equal(pre.logits_last, ref.logits_last)
    assert ev.materialized_tokens == ref_ev.materialized_tokens == 172 + 0  # the prefix is under one chunk


def test_a_tail_covering_the_span_is_a_cold_prefill_and_selective_is_blend(
    case: tuple[mm.LoadedModel, list[int], mz.DonorKV, list[dict[str, Any]]],
) -> None:
    """trailing:N >= the span leaves only the prefix: cold's logits; selective:P% is blend's."""
    lm, ids, donor, spans = case
    cold = mz.cold_prefill(lm, ids)
    all_tail, _ = realize.realize(lm, ids, donor, spans, realize.parse("trailing:300"), decision_id="t")
    assert torch.allclose(all_tail.logits_last, cold.logits_last, atol=1e-4, rtol=0)
    sel, ev = realize.realize(lm, ids, donor, spans, realize.parse("selective:20%"), decision_id="t")
    ref, _ = blend.blend_prefill(
        lm, ids, donor, [{**spans[0], "recompute": 0}, {**spans[1], "recompute": 60}], decision_id="t"
    )
    assert torch.equal(sel.logits_last, ref.logits_last) and ev.recomputed_tokens >= 60


def test_the_study_runs_end_to_end_on_a_tiny_model(tmp_path: Path) -> None:
    """benchmarks/realization_quality.py on tiny: a summary per method with n and intervals, floors."""
    spec = importlib.util.spec_from_file_location(
        "realization_quality", ROOT / "benchmarks" / "realization_quality.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["realization_quality"] = mod
    spec.loader.exec_module(mod)
    argv = ["--model", "tiny", "--pairs", "1", "--tokens", "350", "--max-new-tokens", "4", "--threads", "1"]
    assert mod.main([*argv, "--methods", "none,trailing:64,selective:20%", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["pairs"] == 2 and doc["cold_cold"] == {"n": 2, "identical": 2}
    assert set(doc["methods"]) == {"benign", "none", "trailing:64", "selective:20%"}
    for m in doc["methods"].values():
        assert m["n"] == 2 and len(m["lost_ci95"]) == 2 and 0 < m["computed_share_median"] <= 1
    assert len((tmp_path / "pairs.jsonl").read_text().splitlines()) == 2
