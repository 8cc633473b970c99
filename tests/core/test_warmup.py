"""Warming the decision path (engine_hooks.core.warmup): at start and after each reload, where
decisions are made, with nothing audited, registered or decided by it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.governor import Governor
from engine_hooks.core.settings import HookSettings
from tests.sglang_server.rig import HookFiles, read_audit


def _settings(tmp_path: Path, **env: str) -> HookSettings:
    files = HookFiles.make(tmp_path / "hook")
    base = {**files.env(), "SEMGOV_PROVIDER": "minhash", "SEMGOV_DETOKENIZER": "none",
            "SEMGOV_DECISION_PROCESS": "0", "SEMGOV_ASYNC_REGISTRATION": "0"}  # fmt: skip
    return HookSettings.from_env({**base, **env})


def test_start_warms_the_decision_path_and_writes_no_record(tmp_path: Path) -> None:
    """A governor warms its decision path once at start, on the decision thread; the audit log
    then holds no record, the registry no donor and the provider no entry."""
    settings = _settings(tmp_path)
    gov = Governor(settings, engine_name="test")
    try:
        assert gov.wait_idle()
        assert [(w.reason, w.error) for w in gov.warmups] == [("start", None)]
        assert gov.donor_count() == 0 and gov.provider is not None and len(gov.provider) == 0
        assert gov.metrics.warmups.labels("ok")._value.get() >= 1
    finally:
        gov.close()
    assert read_audit(settings.audit_dir) == []


def test_warmup_off_runs_nothing(tmp_path: Path) -> None:
    """SEMGOV_WARMUP=0: no warm-up job at all (the measurement's baseline)."""
    gov = Governor(_settings(tmp_path, SEMGOV_WARMUP="0"), engine_name="test")
    try:
        assert gov.wait_idle() and gov.warmups == []
    finally:
        gov.close()


def test_a_reload_that_loads_a_policy_warms_again(tmp_path: Path) -> None:
    """After a reload that installed a new live policy revision, the new evaluator is warmed too;
    a reload that changed nothing warms nothing."""
    import shutil

    policy = tmp_path / "policy"
    shutil.copytree(_settings(tmp_path / "a").policy, policy)
    gov = Governor(_settings(tmp_path / "b", SEMGOV_POLICY=str(policy)), engine_name="test")
    try:
        gov.request_reload("same")
        assert gov.wait_idle() and [w.reason for w in gov.warmups] == ["start"]
        yaml = policy / "policy.yaml"
        yaml.write_text(yaml.read_text().replace("\n...", "\n# revised\n...", 1))
        gov.request_reload("test")
        assert gov.wait_idle() and gov.wait_idle()  # NOTE: the reload queues the warm-up behind the first
        assert gov.reloads == 1 and [w.reason for w in gov.warmups] == ["start", "reload"]
    finally:
        gov.close()


def test_a_failing_warmup_is_logged_counted_and_serving_goes_on(tmp_path: Path, monkeypatch: Any) -> None:
    """A provider that fails the warm-up's query: the failure is returned, counted and logged; the
    governor still decides afterwards."""
    from engine_hooks.core.providers.minhash import MinHashProvider

    real = MinHashProvider.query
    calls = {"n": 0}

    def failing_once(self: Any, *a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("cold provider")
        return real(self, *a, **kw)

    monkeypatch.setattr(MinHashProvider, "query", failing_once)
    gov = Governor(_settings(tmp_path), engine_name="test")
    try:
        assert gov.wait_idle()
        (w,) = gov.warmups
        assert w.error is not None and "cold provider" in w.error
        assert gov.metrics.warmups.labels("failed")._value.get() >= 1
        assert gov.provider is not None and len(gov.provider) == 0  # the synthetic entry was removed
    finally:
        gov.close()


@pytest.mark.parametrize("process", ["1"])
def test_the_decision_process_warms_itself(tmp_path: Path, process: str) -> None:
    """With the decision process, the warm-up runs there (where decisions are made) and its
    outcome comes back to the governor; still no record in the audit log."""
    settings = _settings(tmp_path, SEMGOV_DECISION_PROCESS=process, SEMGOV_ASYNC_REGISTRATION="1")
    gov = Governor(settings, engine_name="test")
    try:
        assert gov.wait_idle(60)
        assert [(w.reason, w.error) for w in gov.warmups] == [("start", None)]
    finally:
        gov.close()
    assert read_audit(settings.audit_dir) == []


def test_a_warmup_past_the_decision_timeout_leaves_the_engine_free(tmp_path: Path, monkeypatch: Any) -> None:
    """A cold engine whose first evaluation outlives SEMGOV_DECISION_TIMEOUT_MS (a loaded machine):
    the warm-up waits for that call to return, so the first real decision finds the engine free
    instead of being denied "still busy" without asking it."""
    import time

    from semgov.decide import Evaluator

    real = Evaluator._call_engine
    calls = {"n": 0}

    def slow_first(self: Any, fn: Any, arg: Any, deadline: Any = None) -> Any:
        def slow(a: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                time.sleep(0.5)
            return fn(a)

        return real(self, slow, arg, deadline)

    monkeypatch.setattr(Evaluator, "_call_engine", slow_first)
    gov = Governor(_settings(tmp_path, SEMGOV_DECISION_TIMEOUT_MS="50"), engine_name="test")
    try:
        assert gov.wait_idle()
        assert [(w.reason, w.error) for w in gov.warmups] == [("start", None)]
        assert gov.warmups[0].seconds >= 0.5 and calls["n"] == 1
        assert gov.policies.live.evaluator.wait_for_engine(0.0)
    finally:
        gov.close()
