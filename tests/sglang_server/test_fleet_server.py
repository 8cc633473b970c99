"""client -> ``semgov gateway`` -> the engines' own router (``smg``) -> two real SGLang CPU workers.

The gateway sends SGLang's ``/generate`` (the routers refuse a token-id ``/v1/completions``) with
the scope routing key in ``x-smg-routing-key``; ``smg --policy consistent_hashing`` hashes on it.
One fleet is started for the module (two workers start in about a minute on two cores); the last
test kills a worker and restarts it. Each worker's own audit log says what it realized.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.fixtures import KEYS
from tests.sglang_server.fleet import ROUTING_HEADER, Fleet, fleet, healthy_workers, smg_binary, worker_of
from tests.sglang_server.rig import read_audit, summarize, verify_audit
from tests.sglang_server.test_gateway_server import donor_chat, evidence, recipient_chat

WORDS = 300  # evidence of about 1,100 tokens: past the hook's 256-token floor, quick on one core


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    if smg_binary() is None:
        message = "no smg router (.venv-smg, SEMGOV_SMG or PATH; .ci/run installs smg 1.13.0)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with fleet(tmp_path_factory.mktemp("fleet")) as f:
        yield f
        text = f.gateway.log.read_text()
        assert "Traceback" not in text and "semgov1." not in text, text[-3000:]


def realized(f: Fleet) -> list[dict[str, int]]:
    """Realized tokens by request id, per worker (each worker's own audit log)."""
    return [summarize(read_audit(w.files.audit_dir, wait_s=20)).realized for w in f.workers]


def pair(f: Fleet, seed: str, tenant: str = "acme") -> tuple[str, str]:
    """A donor then a recipient with the same evidence, in ``tenant``'s namespace; their request ids."""
    ev = evidence(seed, WORDS)
    d = f.gateway.post(donor_chat(ev, f"{tenant}/fleet"), tenant=tenant)
    assert d.status_code == 200, d.text
    f.settle()
    r = f.gateway.post(recipient_chat(ev, f"{tenant}/fleet"), tenant=tenant)
    assert r.status_code == 200, r.text
    return d.headers["x-request-id"], r.headers["x-request-id"]


def assert_scoped(f: Fleet) -> None:
    """Every decision of every worker's log has donor scope equal to recipient scope."""
    for w in f.workers:
        for decisions in summarize(read_audit(w.files.audit_dir, wait_s=20)).decisions.values():
            for dec in decisions:
                assert (dec["donor_tenant"], dec["donor_namespace"]) == (dec["tenant"], dec["namespace"]), dec


def test_scope_routing_realizes_reuse_inside_a_tenant_and_never_across(running: Fleet) -> None:
    """A same-tenant pair shares a worker and realizes reuse; another tenant's same evidence realizes none."""
    f = running
    donor, mine = pair(f, "fleet-a")
    where = worker_of(f, donor)
    assert where is not None and worker_of(f, mine) == where
    other = f.gateway.post(recipient_chat(evidence("fleet-a", WORDS), "globex/fleet"), tenant="globex")
    assert other.status_code == 200, other.text
    by_worker = realized(f)
    assert by_worker[where].get(mine, 0) >= 800, by_worker
    assert all(w.get(other.headers["x-request-id"], 0) == 0 for w in by_worker)
    assert_scoped(f)


def test_a_client_cannot_set_the_routing_key(running: Fleet) -> None:
    """A client's own routing-key and target-worker headers are dropped: the gateway's key routes."""
    f = running
    donor, _ = pair(f, "fleet-b")
    where = worker_of(f, donor)
    assert where is not None
    ev = evidence("fleet-b", WORDS)
    headers = {ROUTING_HEADER: "chosen-by-the-client", "x-smg-target-worker": str(1 - where)}
    r = f.gateway.post(recipient_chat(ev, "acme/fleet"), headers=headers)
    assert r.status_code == 200, r.text
    assert worker_of(f, r.headers["x-request-id"]) == where
    assert realized(f)[where].get(r.headers["x-request-id"], 0) >= 800
    # Streamed through the router: SGLang's cumulative /generate text arrives as chat deltas.
    body = {**recipient_chat(ev, "acme/fleet"), "stream": True}
    hdrs = {"authorization": f"Bearer {KEYS['acme']}"}
    with httpx.stream(
        "POST", f.gateway.url + "/v1/chat/completions", json=body, headers=hdrs, timeout=300
    ) as s:
        assert s.status_code == 200
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert (
        "".join(c["choices"][0]["delta"]["content"] for c in chunks)
        and chunks[-1]["choices"][0]["finish_reason"]
    )


def _receipts(w: Any) -> int:
    """How many requests the worker's log says it received (``--log-requests``)."""
    return w.log_text().count("Receive:") if w.log_path.exists() else 0


def test_a_killed_worker_fails_over_and_a_restarted_one_serves_again(running: Fleet) -> None:
    """Kill a worker mid-request: the rest run on the other, both logs verify; restarted, it serves again."""
    f = running
    donor, _ = pair(f, "fleet-c")
    victim = worker_of(f, donor)
    assert victim is not None
    survivor, w = 1 - victim, f.workers[victim]
    # In flight on the victim when it dies: a long generation in the scope and evidence keyed to it.
    long_body = {**recipient_chat(evidence("fleet-c", WORDS), "acme/fleet"), "max_tokens": 400}
    inflight: dict[str, Any] = {}

    def send() -> None:
        try:
            inflight["r"] = f.gateway.post(long_body)
        except httpx.HTTPError as e:
            inflight["r"] = e

    before = _receipts(w)
    client = threading.Thread(target=send)
    client.start()
    deadline = time.monotonic() + 60
    while _receipts(w) == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _receipts(w) > before, "the long request never reached the victim"
    time.sleep(0.5)
    assert w.proc is not None and client.is_alive(), "the long request ended before the kill"
    os.killpg(w.proc.pid, signal.SIGKILL)  # NOTE: the whole group: launcher, scheduler, detokenizer
    w.proc.wait(timeout=30)
    client.join(timeout=300)
    r = inflight["r"]
    print(f"fleet: the request in flight on the killed worker got {getattr(r, 'status_code', r)!r}")
    assert isinstance(r, httpx.Response) and r.status_code in (200, 502), r
    if r.status_code == 200:  # NOTE: the router retried it elsewhere: served cold on the survivor
        assert r.headers["x-request-id"] in f.workers[survivor].log_text()
    # The dead worker's scopes now hash to the survivor: every request is served there.
    rids = {}
    for seed in ("fleet-c", "kill-1", "kill-2", "kill-3"):
        after = f.gateway.post(recipient_chat(evidence(seed, WORDS), "acme/fleet"))
        assert after.status_code == 200, after.text
        rids[seed] = after.headers["x-request-id"]
        assert worker_of(f, rids[seed]) == survivor
    if r.status_code == 502:  # NOTE: its donor died with the victim, and nothing registered it again
        assert realized(f)[survivor].get(rids["fleet-c"], 0) == 0
    f.restart(victim)
    deadline = time.monotonic() + 60
    while len(healthy_workers(f.router)) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(healthy_workers(f.router)) == 2, f.router.tail()
    for i in range(8):  # a fresh scope whose key hashes to the restarted worker
        donor, mine = pair(f, f"fleet-back-{i}")
        if worker_of(f, donor) == victim:
            break
    assert worker_of(f, donor) == victim and worker_of(f, mine) == victim
    assert realized(f)[victim].get(mine, 0) >= 800
    assert_scoped(f)
    for w in f.workers:
        assert verify_audit(w.files) is None, verify_audit(w.files)
