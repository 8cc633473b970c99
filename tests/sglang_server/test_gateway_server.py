"""client -> ``semgov gateway`` (the real CLI, uvicorn) -> a real SGLang CPU server with the hook.

The server serves the tiny model (dummy weights) with SmolLM2's tokenizer and chat template, so
the gateway's token ids and segments are exactly what SGLang serves, and its answers are text.
Two tenants send the same evidence; the engine's own audit log says what was realized. A
calibration run's pair goes through ``POST /v1/semgov/calibrate``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from semgov.gateway.prompt import ModelTokenizer
from tests.gateway.fixtures import KEYS, tenants_yaml, tokenizer_dir
from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import (
    AUDIENCE,
    ROOT,
    TINY_MODEL,
    Server,
    ServerConfig,
    free_port,
    launch,
    read_audit,
    settle,
    summarize,
)

WORDS = "revenue margin quarter capital guidance segment churn backlog pipeline dividend".split()


def evidence(seed: str, words: int = 900) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(WORDS)} {rng.randrange(10_000)}." for _ in range(words // 2))


SYSTEM = "You are a careful financial analyst. Answer with one JSON object. " * 3


def donor_chat(ev: str, namespace: str) -> dict[str, Any]:
    """``[S][I][E][Q1]``: system, an instruction, the evidence, a question."""
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Read the research file and answer briefly."},
            {"role": "user", "content": "Research file:\n" + ev},
            {"role": "user", "content": "What was the revenue?"},
        ],
        "semgov": {"namespace": namespace, "segments": [{"message": 1, "role": "instruction"},
                                                       {"message": 2, "role": "evidence"}]},
        "max_tokens": 4,
        "ignore_eos": True,
        "temperature": 0,
    }  # fmt: skip


def recipient_chat(ev: str, namespace: str) -> dict[str, Any]:
    """``[S][E][Q2]``: the same evidence after another prefix (a shifted span for the hook)."""
    return {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Research file:\n" + ev},
            {"role": "user", "content": "What was the margin?"},
        ],
        "semgov": {"namespace": namespace, "segments": [{"message": 1, "role": "evidence"}]},
        "max_tokens": 4,
        "ignore_eos": True,
        "temperature": 0,
    }


def model_dir(directory: Path) -> Path:
    """The tiny model's config with SmolLM2's tokenizer files (same 49,152-token vocabulary)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(TINY_MODEL / "config.json", directory / "config.json")
    for f in tokenizer_dir().iterdir():
        if f.is_file() and f.name != "semgov-source.json":
            shutil.copy(f, directory / f.name)
    return directory


@dataclass
class Deployment:
    server: Server
    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def post(self, path: str, body: Any, tenant: str = "acme", **kw: Any) -> httpx.Response:
        headers = {"authorization": f"Bearer {KEYS[tenant]}"}
        return httpx.post(self.url + path, json=body, headers=headers, timeout=300, **kw)

    def engine_metric(self, name: str) -> float:
        text = httpx.get(f"http://{self.server.host}:{self.server.port}/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def start_gateway(server: Server, work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    tenants = work / "tenants.yaml"
    tenants.write_text(tenants_yaml(calibrate=("acme",)))  # NOTE: acme's key may calibrate, globex's not
    port = free_port()
    log = work / "gateway.log"
    cmd = [sys.executable, "-m", "semgov.cli.main", "gateway", "serve", "--tenants", str(tenants),
           "--context-key", str(server.files.context_key), "--audience", AUDIENCE, "--engine", "sglang",
           "--upstream", f"http://{server.host}:{server.port}", "--model", "tiny",
           "--tokenizer", str(tokenizer_dir()), "--port", str(port), "--timeout-s", "300"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("wb"), env=env, cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited (rc {proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"no gateway /health after 120 s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("gateway-sglang")
    config = ServerConfig(
        model=model_dir(work / "model"), dummy_weights=False, page_size=1, chunked_prefill_size=1024,
        extra_args=("--load-format", "dummy", "--served-model-name", "tiny", "--enable-metrics"),
    )  # fmt: skip
    with launch(config, work / "server") as server:
        proc, url, log = start_gateway(server, work)
        try:
            yield Deployment(server, url, log, proc)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
        assert KEYS["acme"] not in text and KEYS["globex"] not in text and "semgov1." not in text


def test_reuse_is_realized_inside_a_tenant_and_never_across(deployment: Deployment) -> None:
    """Same evidence from two tenants: acme's recipient realizes acme's donor; globex's realizes nothing."""
    d = deployment
    ev = evidence("shared")
    donor = d.post("/v1/chat/completions", donor_chat(ev, "acme/q3"))
    assert donor.status_code == 200, donor.text
    assert donor.json()["choices"][0]["message"]["content"]
    settle(d.server)
    other = d.post("/v1/chat/completions", recipient_chat(ev, "globex/q3"), tenant="globex")
    mine = d.post("/v1/chat/completions", recipient_chat(ev, "acme/q3"))
    assert other.status_code == 200 and mine.status_code == 200, (other.text, mine.text)
    rids = {k: r.headers["x-request-id"] for k, r in (("donor", donor), ("other", other), ("mine", mine))}
    audit = summarize(read_audit(d.server.files.audit_dir, wait_s=20))
    assert audit.realized.get(rids["mine"], 0) >= 800, (audit.realized, audit.counts)
    assert audit.realized.get(rids["other"], 0) == 0
    assert audit.allowed(rids["mine"]) >= 1
    assert audit.decisions.get(rids["other"], []) == []  # NOTE: acme's donor is not even a candidate
    # The segments the gateway signed are those of the ids SGLang served: the hook's allowed shifted span
    # lies inside the evidence segment the gateway computed for the recipient, at its offsets.
    body = recipient_chat(ev, "acme/q3")
    prompt = ModelTokenizer(tokenizer_dir()).chat(body["messages"], ["system", "evidence", "question"])
    (e_role, e_start, e_end) = prompt.segments[1]
    [allow] = [x for x in audit.decisions[rids["mine"]] if x["decision"] == "allow"]
    assert e_role == "evidence" and allow["recipient_tokens"] == len(prompt.ids)
    [span] = [x for x in allow["approved_spans"] if x["kind"] == "shifted"]
    assert e_start <= span["recipient_start"] and span["recipient_start"] + span["length"] <= e_end
    assert span["length"] >= (e_end - e_start) * 0.9
    for decisions in audit.decisions.values():  # NOTE: every decision of the log, not only this test's
        for dec in decisions:
            assert (dec["donor_tenant"], dec["donor_namespace"]) == (dec["tenant"], dec["namespace"]), dec
    assert_healthy(d.server)


def test_a_claim_on_another_tenants_namespace_reaches_no_engine(deployment: Deployment) -> None:
    """globex claiming acme's namespace gets 403, and SGLang counts no request for it."""
    d = deployment
    before = d.engine_metric("sglang:num_requests_total")
    r = d.post("/v1/chat/completions", recipient_chat(evidence("x"), "acme/q3"), tenant="globex")
    assert r.status_code == 403 and "namespace" in r.json()["error"]["message"]
    time.sleep(1.0)
    assert d.engine_metric("sglang:num_requests_total") == before


def test_chat_and_completions_stream_through_the_gateway(deployment: Deployment) -> None:
    """Streamed chat arrives as chat.completion.chunk deltas; streamed completions as SGLang sent them."""
    d = deployment
    body = {**recipient_chat(evidence("stream"), "acme/s"), "stream": True}
    headers = {"authorization": f"Bearer {KEYS['acme']}"}
    with httpx.stream("POST", d.url + "/v1/chat/completions", json=body, headers=headers, timeout=300) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    body = {"prompt": "Hello there, analyst.", "max_tokens": 4, "ignore_eos": True, "stream": True,
            "semgov": {"namespace": "acme/s"}}  # fmt: skip
    with httpx.stream("POST", d.url + "/v1/completions", json=body, headers=headers, timeout=300) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[0])["object"] == "text_completion"


def test_sixteen_concurrent_clients_with_aborts(deployment: Deployment) -> None:
    """16 clients at once, every third hanging up mid-stream: the rest get 200, the server stays healthy."""
    d = deployment
    results: dict[int, Any] = {}

    def client(i: int) -> None:
        tenant = "acme" if i % 2 else "globex"
        body = {**recipient_chat(evidence(f"c{i % 4}"), f"{tenant}/conc"), "max_tokens": 8}
        hdrs = {"authorization": f"Bearer {KEYS[tenant]}"}
        try:
            if i % 3 == 0:
                body["stream"] = True
                with httpx.stream(
                    "POST", d.url + "/v1/chat/completions", json=body, headers=hdrs, timeout=300
                ) as r:
                    next(r.iter_bytes())
                results[i] = "aborted"
            else:
                results[i] = httpx.post(
                    d.url + "/v1/chat/completions", json=body, headers=hdrs, timeout=300
                ).status_code
        except Exception as e:  # noqa: BLE001 - reported below
            results[i] = repr(e)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert all(results[i] == ("aborted" if i % 3 == 0 else 200) for i in range(16)), results
    settle(d.server)
    after = d.post("/v1/chat/completions", recipient_chat(evidence("after"), "acme/q3"))
    assert after.status_code == 200
    assert_healthy(d.server)
    metrics = httpx.get(d.url + "/metrics", timeout=30).text
    assert 'outcome="aborted"' in metrics


def calibrate(d: Deployment, prompt: Any, role: str, label: str, plan: str | None = None) -> dict[str, Any]:
    """One request of calibration run ``gw-run-1`` in acme/cal through the gateway's route: its answer."""
    claim = {"run": "gw-run-1", "role": role, **({"plan": plan} if plan else {})}
    body = {"request_id": f"gw-run-1.{label}", "input_ids": prompt.ids,
            "segments": [list(s) for s in prompt.segments], "namespace": "acme/cal", "calibration": claim,
            "max_new_tokens": 4}  # fmt: skip
    r = d.post("/v1/semgov/calibrate", body)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    assert doc["meta_info"]["prompt_tokens"] == len(prompt.ids) and 0 < len(doc["output_ids"]) <= 4
    return doc


def test_a_calibration_pair_through_the_route_realizes_the_donors_evidence(deployment: Deployment) -> None:
    """Through the calibrate route a run's recipient realizes its donor's evidence under the plan; its
    cold twin realizes nothing; after the run's release a recipient finds no donor."""
    d = deployment
    tok = ModelTokenizer(tokenizer_dir())
    ev = evidence("calibrate")
    donor = tok.chat(donor_chat(ev, "-")["messages"], ["system", "instruction", "evidence", "question"])
    recipient = tok.chat(recipient_chat(ev, "-")["messages"], ["system", "evidence", "question"])
    calibrate(d, donor, "donor", "donor")
    settle(d.server)
    cold = calibrate(d, recipient, "cold", "cold")
    warm = calibrate(d, recipient, "recipient", "recipient", "bookend:16+256")
    calibrate(d, donor, "release", "release")
    settle(d.server)
    late = calibrate(d, recipient, "recipient", "after-release", "bookend:16+256")
    audit = summarize(read_audit(d.server.files.audit_dir, wait_s=20))
    rid = warm["request_id"]
    assert rid.startswith("semgov-calibrate-acme-app.") and rid.endswith("-gw-run-1.recipient")
    assert audit.realized.get(rid, 0) >= 800, (audit.realized, audit.counts)
    [allow] = [x for x in audit.decisions[rid] if x["decision"] == "allow"]
    assert allow["namespace"] == "acme/cal/semgov-calibration/gw-run-1" and allow["tenant"] == "acme"
    assert allow["policy"]["revision"].endswith("+calibrate:bookend:16+256"), allow["policy"]
    assert audit.realized.get(cold["request_id"], 0) == 0 and cold["request_id"] not in audit.decisions
    assert audit.realized.get(late["request_id"], 0) == 0, audit.realized
    assert audit.counts.get("event:calibration_released", 0) >= 1, audit.counts
    r = d.post("/v1/semgov/calibrate", {"request_id": "x"}, tenant="globex")  # NOTE: refused before the body
    assert r.status_code == 403 and "calibrate: true" in r.json()["error"]["message"]
    assert_healthy(d.server)
