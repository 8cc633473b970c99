"""The gateway's fleet pieces: the scope routing key, and SGLang's /generate body and answers in
completions form (the real router and workers: tests/sglang_server/test_fleet_server.py)."""

from __future__ import annotations

import json

import pytest

from semgov.cli.gateway import _routing_header
from semgov.errors import InputError
from semgov.gateway.fleet import (
    GenerateStream,
    completion_from_generate,
    generate_body,
    routing_key,
    routing_secret,
)
from semgov.gateway.tenants import Refusal

SECRET = routing_secret(b"k" * 32)
IDS = list(range(100, 160))
DONOR = [("system", 0, 10), ("instruction", 10, 20), ("evidence", 20, 50), ("question", 50, 60)]


def test_requests_that_could_share_evidence_get_one_key() -> None:
    """Same tenant, namespace and evidence ids give one key, wherever the evidence sits in the prompt."""
    shifted = IDS[:10] + IDS[20:50] + [7, 8, 9]
    recipient = [("system", 0, 10), ("evidence", 10, 40), ("question", 40, 43)]
    key = routing_key(SECRET, "acme", "acme/q3", IDS, DONOR)
    assert key == routing_key(SECRET, "acme", "acme/q3", shifted, recipient)
    assert len(key) == 32 and int(key, 16) >= 0


def test_the_key_separates_tenants_namespaces_evidence_and_secrets() -> None:
    """Another tenant, namespace, evidence or secret gives another key; the key shows none of them."""
    key = routing_key(SECRET, "acme", "acme/q3", IDS, DONOR)
    other_ev = IDS[:20] + [5] * 30 + IDS[50:]
    others = {
        routing_key(SECRET, "globex", "acme/q3", IDS, DONOR),
        routing_key(SECRET, "acme", "acme/q4", IDS, DONOR),
        routing_key(SECRET, "acme", "acme/q3", other_ev, DONOR),
        routing_key(routing_secret(b"j" * 32), "acme", "acme/q3", IDS, DONOR),
    }
    assert key not in others and len(others) == 4
    assert "acme" not in key


def test_without_evidence_the_key_is_the_scopes() -> None:
    """Prompts without an evidence segment share their scope's key."""
    a = routing_key(SECRET, "acme", "acme/q3", [1, 2, 3], [("other", 0, 3)])
    assert a == routing_key(SECRET, "acme", "acme/q3", [4, 5], [("question", 0, 2)])


def test_generate_body_maps_the_completions_fields() -> None:
    """Completions sampling fields become SGLang's sampling_params; token and request id ride beside."""
    fields = {"max_tokens": 8, "temperature": 0, "seed": 3, "min_tokens": 1, "stop": ["x"], "user": "u"}
    body = generate_body(
        model="m", ids=[1, 2], token="semgov1.t", request_id="gw-1", fields=fields, stream=True
    )
    assert body == {
        "model": "m", "input_ids": [1, 2], "stream": True, "extra_key": "semgov1.t", "rid": "gw-1",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0, "sampling_seed": 3, "min_new_tokens": 1,
                            "stop": ["x"]},
    }  # fmt: skip


@pytest.mark.parametrize("fields", [{"logprobs": 2}, {"echo": True}, {"n": 2}])
def test_generate_body_refuses_what_it_cannot_carry(fields: dict[str, object]) -> None:
    """logprobs, echo and n > 1 have no faithful /generate form here: 400, naming them."""
    with pytest.raises(Refusal) as e:
        generate_body(model="m", ids=[1], token="t", request_id="r", fields=fields, stream=False)
    assert e.value.status == 400 and next(iter(fields)) in e.value.message


def test_a_generate_answer_becomes_a_completion() -> None:
    """SGLang's /generate answer reads as a text_completion with the engine's id, reason and counts."""
    raw = json.dumps({"text": "forty-two", "output_ids": [1, 2], "meta_info": {
        "id": "gw-1", "finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 5,
        "completion_tokens": 2}}).encode()  # fmt: skip
    doc = completion_from_generate(raw, "tiny")
    assert doc["id"] == "gw-1" and doc["object"] == "text_completion" and doc["model"] == "tiny"
    assert doc["choices"] == [{"index": 0, "text": "forty-two", "logprobs": None, "finish_reason": "length"}]
    assert doc["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    with pytest.raises((ValueError, KeyError, TypeError)):
        completion_from_generate(b'{"text": "x"}', "tiny")


def test_a_generate_stream_becomes_completion_deltas() -> None:
    """Cumulative /generate text arrives as deltas; the last chunk has the reason, usage if asked."""
    s = GenerateStream("tiny", include_usage=True)
    events = []
    for text, reason in (("for", None), ("forty", None), ("forty-two", {"type": "stop"})):
        meta = {"id": "gw-2", "finish_reason": reason, "prompt_tokens": 3, "completion_tokens": 2}
        events += s.event(json.dumps({"text": text, "meta_info": meta}).encode())
    events += s.event(b"[DONE]")
    docs = [json.loads(e) for e in events[:-1]]
    assert events[-1] == b"[DONE]"
    assert [c["text"] for d in docs[:3] for c in d["choices"]] == ["for", "ty", "-two"]
    assert docs[2]["choices"][0]["finish_reason"] == "stop" and docs[0]["choices"][0]["finish_reason"] is None
    assert docs[3]["choices"] == [] and docs[3]["usage"]["total_tokens"] == 5
    assert s.event(b'{"error": {"message": "x"}}') == [b'{"error": {"message": "x"}}']


def test_the_routing_header_must_be_a_header_the_gateway_does_not_set() -> None:
    """--routing-key-header takes a header name, lower-cased; not one the gateway sets, not a bad name."""
    assert _routing_header("X-SMG-Routing-Key") == "x-smg-routing-key"
    assert _routing_header(None) is None
    for bad in ("x-request-id", "Authorization", "bad header", "", "x:y"):
        with pytest.raises(InputError):
            _routing_header(bad)
