"""Side channels of cross-tenant probes: what a probe's decision records and the hook's answer hold.

No timing here (timing is benchmarks/side_channel.py); these check the properties the timing
measurement rests on, and the benchmark's AUC on known inputs.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from semgov.wire.models import GATES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("side_channel", ROOT / "benchmarks" / "side_channel.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("side_channel", mod)
    spec.loader.exec_module(mod)
    return mod


def _brute_auc(pos: list[float], neg: list[float]) -> float:
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("engine", ["yaml", "regorus"])
@pytest.mark.parametrize("layout", ["prefix", "shifted"])
def test_cross_tenant_probe_evaluates_every_gate(sc: ModuleType, engine: str, layout: str) -> None:
    """A cross-tenant probe is denied with all ten gates evaluated, whether or not the tokens match."""
    keys = sc.CoreKeys.generate()
    reqs = sc.core_pool(keys, tokens=512, layout=layout, tenant=sc.ATTACKER, pool=1, seed=3)
    ev = sc.core_evaluator(engine, keys)
    for cls in (1, 0):
        [d] = ev.evaluate(reqs[cls][0])
        rec = d.record
        assert [g["gate"] for g in rec["gates"]] == list(GATES) and len(rec["gates"]) == 10
        assert all(g["result"] in ("pass", "fail", "error") and g["detail"] for g in rec["gates"])
        assert next(g for g in rec["gates"] if g["gate"] == "tenant")["result"] == "fail"
        assert rec["decision"] == "deny" and rec["approved_spans"] == [] and rec["approved_tokens"] == 0


def test_same_tenant_reference_allows_only_the_match(sc: ModuleType) -> None:
    """The same-tenant reference is what it claims: the matching probe is allowed, the other denied."""
    keys = sc.CoreKeys.generate()
    reqs = sc.core_pool(keys, tokens=512, layout="prefix", tenant=sc.VICTIM, pool=1, seed=3)
    ev = sc.core_evaluator("yaml", keys)
    assert [ev.evaluate(reqs[c][0])[0].decision for c in (1, 0)] == ["allow", "deny"]


@pytest.mark.sglang
def test_hook_probe_reveals_nothing_about_another_tenants_donor(sc: ModuleType, tmp_path: Path) -> None:
    """Via the real hook a probe gets equal prefix, host hit, cached_tokens (0) and no decision either way."""
    pytest.importorskip("sglang")
    rig = sc.HookRig(sc.hook_runtime(), sc.hook_files(tmp_path), pool=2, seed=7)
    try:
        probe = rig.probe("cross")
        for cls, k in itertools.product((1, 0), (0, 1, 0, 1)):
            probe(cls, k)
        assert set(rig.seen["cross"][1]) == set(rig.seen["cross"][0]) == {sc.Seen(0, 0, 0)}
        assert rig.clean()
        views = [rig.caller_view("cross", c, k) for c in (1, 0) for k in (0, 1)]
        assert all(v == views[0] for v in views)
        v: dict[str, Any] = views[0]
        assert v["prefix_len"] == v["host_hit_length"] == v["cached_tokens"] == v["hook_decisions"] == 0
        assert rig.decision_records_for("cross-") == 0
        own = rig.caller_view("own", 1)
        assert own["host_hit_length"] > 0 and own["hook_decisions"] == 1  # the rig does reuse, in-tenant
        assert own["cached_tokens"] == own["prefix_len"] + own["host_hit_length"]
        assert rig.clean()
    finally:
        rig.close()


def test_auc_on_known_inputs(sc: ModuleType) -> None:
    """AUC is U/(n1*n0) with ties as one half: separation, reversal, all ties and a hand-counted case."""
    assert sc.auc([3, 4, 5], [0, 1, 2]) == 1.0
    assert sc.auc([0, 1, 2], [3, 4, 5]) == 0.0
    assert sc.auc([7, 7, 7], [7, 7]) == 0.5
    # pairs: 1 beats 0; 2 ties 2, 2 and beats 0; 3 beats all three -> (5 + 2/2) / 9
    assert sc.auc([1, 2, 3], [2, 2, 0]) == 2 / 3
    assert sc.auc_counts([1, 2, 3], [2, 2, 0]) == (5, 2)
    with pytest.raises(ValueError):
        sc.auc([], [1.0])


def test_auc_matches_brute_force_with_ties(sc: ModuleType) -> None:
    """AUC equals the all-pairs count on random inputs with many ties, and auc(a, b) = 1 - auc(b, a)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        pos = rng.integers(0, 6, int(rng.integers(1, 40))).tolist()
        neg = rng.integers(0, 6, int(rng.integers(1, 40))).tolist()
        assert sc.auc(pos, neg) == pytest.approx(_brute_auc(pos, neg), abs=1e-15)
        assert sc.auc(pos, neg) + sc.auc(neg, pos) == pytest.approx(1.0, abs=1e-15)


def test_bootstrap_ci_and_p_value(sc: ModuleType) -> None:
    """The bootstrap CI brackets the AUC; identical classes give p = 1, separated ones a tiny p."""
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 300).tolist(), rng.normal(0.5, 1, 300).tolist()
    lo, hi = sc.bootstrap_ci(b, a, rng, b=200)
    assert 0.0 <= lo <= sc.auc(b, a) <= hi <= 1.0
    assert sc.mwu_p([1, 1, 1], [1, 1]) == 1.0
    assert sc.mwu_p(list(range(100, 200)), list(range(100))) < 1e-20
