"""The hook's log lines name the request, tenant and decision they are about, and never carry a
secret (issue 17): prompt or donor text, token ids, key material."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.decider import _request_fields
from engine_hooks.sglang.state import ReqState, log_fields
from semgov import log
from semgov.context import RequestContext
from semgov.typing import SignedDecision
from tests.core.files import CONTRACT, TASK, HookFiles
from tests.sglang_hook.scenario import LEAKY_SECRET

ROOT = Path(__file__).resolve().parents[2]
SECRET = LEAKY_SECRET

# Run in a fresh process (SEMGOV_LOG_FORMAT=json configures structlog for the whole process): a
# donor whose text cannot be made (a detokenizer whose error quotes the prompt on its second
# line) and one that registers, then, in thread mode, a recipient whose decision raises the same way.
SCRIPT = """
import sys, time
from array import array
from semgov.context import RequestContext
from engine_hooks.core.donors import DonorSpec
from engine_hooks.core.governor import Governor
from engine_hooks.core.policies import HookPolicies
from engine_hooks.core.settings import HookSettings
from tests.core.files import CONTRACT, TASK

SEGS = (("system", 0, 200), ("evidence", 200, 600), ("question", 600, 650))
ctx = RequestContext("acme", "ns1", dict(TASK), dict(CONTRACT), SEGS, None)
ids = array("q", range(1000, 1650))
gov = Governor(HookSettings.from_env(), engine_name="test")
gov.submit_donor(DonorSpec("donor-1", ctx, ctx.cache_key(gov.context_key), None, ids[:640], None))
gov.submit_donor(DonorSpec("donor-2", ctx, ctx.cache_key(gov.context_key), None, ids, None))
gov.wait_registrations(60)
gov.drain_donors()
if sys.argv[1] == "thread":
    def boom(*a, **k):
        raise RuntimeError("policy blew up\\n" + SECRET_TEXT + " " + str(list(ids[:40])))
    HookPolicies.decide_live = boom
    job = gov.decide_later("req-7", ctx, None, ids)
    deadline = time.monotonic() + 60
    while not job.done and time.monotonic() < deadline:
        time.sleep(0.005)
    gov.wait_idle(60)
gov.close()
"""


def _run(hook_files: HookFiles, mode: str) -> list[dict[str, Any]]:
    env = {
        **os.environ,
        **hook_files.env(
            SEMGOV_LOG_FORMAT="json",
            SEMGOV_DETOKENIZER="tests.sglang_hook.scenario:leaky_failing_detokenizer",
            SEMGOV_DECISION_PROCESS="1" if mode == "process" else "0",
            SEMGOV_ASYNC_REGISTRATION="1",
            SEMGOV_ASYNC_DECISIONS="1",
            SEMGOV_STRICT="0",
        ),
    }
    code = f"SECRET_TEXT = {SECRET!r}\n" + SCRIPT
    out = subprocess.run(
        [sys.executable, "-c", code, mode],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert SECRET not in out.stderr and "alice@example.com" not in out.stderr
    assert "1000, 1001, 1002" not in out.stderr  # no token ids either
    return [json.loads(x) for x in out.stderr.splitlines() if x.startswith("{")]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_failures_are_logged_with_request_and_tenant_and_no_text(hook_files: HookFiles, mode: str) -> None:
    """Donor registration that fails (in-process or in the decision process) logs the donor id,
    tenant and namespace; a decision that raises on the decision thread logs the request id,
    tenant and namespace (bound for the whole job); both only the error's first line, never the
    text or tokens it quoted."""
    lines = _run(hook_files, mode)
    (line,) = [x for x in lines if x["event"] == "donor registration failed"]
    assert (line["donor_id"], line["tenant"], line["namespace"]) == ("donor-1", "acme", "ns1")
    assert line["error"] == "ValueError: cannot decode"
    if mode == "thread":
        failed = [
            x for x in lines if x["event"] in ("semgov decision failed", "semgov candidate search failed")
        ]
        assert failed, [x["event"] for x in lines]
        for x in failed:
            assert (x["request_id"], x["tenant"], x["namespace"]) == ("req-7", "acme", "ns1")
            assert x["error"] == "RuntimeError: policy blew up"


def test_secret_fields_are_redacted_and_long_values_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    """Whatever a caller passes, fields named like text, tokens or keys are never printed, long
    strings and lists are cut, and fields bound for the block appear on every line inside it."""
    with log.bound(request_id="r-1", tenant="acme"):
        log.get_logger().warning("x", text=SECRET, token_ids=[1, 2, 3], key="-----BEGIN", note="a" * 2000,
                                 ids=list(range(100)))  # fmt: skip
    log.get_logger().warning("after")
    err = capsys.readouterr().err
    first, second = err.splitlines()
    assert SECRET not in err and "BEGIN" not in err and "[1, 2, 3]" not in err
    assert (
        "request_id=r-1" in first and "tenant=acme" in first and "[truncated]" in first and "84 more" in first
    )
    assert "request_id" not in second


def test_describe_error_keeps_no_validation_input() -> None:
    """A pydantic validation error is described by field and error type, never by the value it rejected."""
    from pydantic import BaseModel, ValidationError

    class M(BaseModel):
        n: int

    with pytest.raises(ValidationError) as e:
        M(n=SECRET)  # type: ignore[arg-type]
    described = log.describe_error(e.value)
    assert described == "ValidationError: n: int_parsing" and SECRET not in described


def test_request_state_names_request_tenant_and_chosen_decision() -> None:
    """A scheduler-thread line about a request names its label, tenant, namespace and, once one
    was chosen, the decision it acts on; a decide message names its request and tenant."""
    ctx = RequestContext("acme", "ns1", dict(TASK), dict(CONTRACT), None, None)
    st = ReqState(1, "req-9", ctx, "key", None)
    assert log_fields(st) == {"request_id": "req-9", "tenant": "acme", "namespace": "ns1"}
    st.chosen = SignedDecision({"decision_id": "d-1"}, b"{}")
    assert log_fields(st)["decision_id"] == "d-1"
    assert log_fields(None) == {}
    msg = ("decide", 3, "req-9", ctx, "scope", array("q", [1, 2]), None, 8)
    assert _request_fields(msg) == {"request_id": "req-9", "tenant": "acme", "namespace": "ns1"}
    assert _request_fields(("decide",)) == {}
