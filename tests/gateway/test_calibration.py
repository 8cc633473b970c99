"""The calibration route (POST /v1/semgov/calibrate) in-process against an engine stand-in: who may
calibrate, what is minted and sent to SGLang's /generate, what is refused before any engine, and
how the engine's answer is checked. The real server: tests/sglang_server/test_gateway_server.py."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_hooks.core.plan import request_label
from semgov import log
from semgov.cli.main import main
from semgov.context import CalibrationClaim, ContextKeys, calibration_namespace, parse_context_token
from semgov.gateway import Gateway
from semgov.gateway.calibration import engine_rid
from semgov.gateway.fleet import routing_key, routing_secret
from semgov.gateway.prompt import ROLES
from tests.gateway.fixtures import (
    AUDIENCE,
    CONTRACT,
    KEYS,
    TASK,
    FakeEngine,
    GatewayOptions,
    run,
    serving,
    tenants_yaml,
)

ROUTE = "/v1/semgov/calibrate"
CAL = GatewayOptions(calibrate=("acme",))
IDS = list(range(1000, 1040))
SEGMENTS = [["system", 0, 10], ["evidence", 10, 35], ["question", 35, 40]]
RID = re.compile(r"semgov-calibrate-[A-Za-z0-9_-]{1,12}\.[0-9a-f]{32}-[A-Za-z0-9._-]{1,64}")


def auth(tenant: str = "acme") -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def body(**over: Any) -> dict[str, Any]:
    """A recipient's calibration request of run r1 in acme/q3, with ``over`` replacing members."""
    doc: dict[str, Any] = {
        "request_id": "r1.recipient.bookend",
        "input_ids": IDS,
        "segments": SEGMENTS,
        "namespace": "acme/q3",
        "task": TASK,
        "response_contract": CONTRACT,
        "calibration": {"run": "r1", "role": "recipient", "plan": "bookend:16+256"},
        "max_new_tokens": 16,
    }
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


async def refusals(c: httpx.AsyncClient) -> str:
    return (await c.get("/metrics")).text


def test_a_permitted_key_gets_a_token_with_the_claim_and_the_runs_namespace(tmp_path: Path) -> None:
    """A calibrate key's request reaches SGLang's /generate greedy, with the claim, run namespace and rid."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, json=body(), headers=auth())
        assert r.status_code == 200, r.text
        (sent,) = fake.bodies
        assert fake.paths == ["/generate"]  # NOTE: the target's --upstream-api is completions
        assert sent["input_ids"] == IDS and sent["stream"] is False
        assert sent["sampling_params"] == {"temperature": 0, "max_new_tokens": 16}
        ctx = parse_context_token(ContextKeys(b"k" * 32, AUDIENCE), sent["extra_key"])
        assert (ctx.tenant, ctx.namespace, ctx.task, ctx.response_contract) == (
            "acme", "acme/q3/semgov-calibration/r1", TASK, CONTRACT,
        )  # fmt: skip
        assert ctx.calibration == CalibrationClaim("r1", "recipient", "bookend:16+256")
        assert ctx.segments == tuple(tuple(s) for s in SEGMENTS)
        assert sent["rid"] == engine_rid("acme-app", "r1.recipient.bookend")
        doc = r.json()
        assert doc == {
            "request_id": sent["rid"], "output_ids": list(range(7, 23)), "text": "forty-two",
            "meta_info": {"prompt_tokens": 40, "completion_tokens": 16, "cached_tokens": 3,
                          "finish_reason": "length"},
        }  # fmt: skip
        assert r.headers["x-request-id"].startswith("gw-")
        assert 'outcome="ok",route="calibrate",tenant="acme"} 1.0' in await refusals(c)

    run(tmp_path, scenario, options=CAL)


def test_a_donor_without_segments_or_plan_is_minted_as_sent(tmp_path: Path) -> None:
    """A donor with no segments: the token has the donor claim, no plan and no segments."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        claim = {"run": "r-2_x", "role": "donor"}
        r = await c.post(ROUTE, json=body(segments=None, calibration=claim), headers=auth())
        assert r.status_code == 200, r.text
        ctx = parse_context_token(ContextKeys(b"k" * 32, AUDIENCE), fake.bodies[0]["extra_key"])
        assert ctx.calibration == CalibrationClaim("r-2_x", "donor", None) and ctx.segments is None
        assert ctx.namespace == calibration_namespace("acme/q3", "r-2_x")

    run(tmp_path, scenario, options=CAL)


def test_a_key_without_calibrate_true_is_refused_before_any_engine(tmp_path: Path) -> None:
    """globex's entry lacks `calibrate: true`: 403 with reason calibration naming the field; nothing sent."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, json=body(namespace="globex/q3"), headers=auth("globex"))
        assert r.status_code == 403 and "calibrate: true" in r.json()["error"]["message"], r.text
        assert r.json()["error"]["type"] == "permission_error"
        assert fake.bodies == []
        assert 'semgov_gateway_refusals_total{reason="calibration"} 1.0' in await refusals(c)
        r = await c.post(ROUTE, json=body(), headers={"authorization": "Bearer sgk_wrong"})
        assert r.status_code == 401 and fake.bodies == []

    run(tmp_path, scenario, options=CAL)


_LONG_BASE = "acme/" + "n" * 100  # 105 characters: allowed, but its run namespace is 125 + len(run)
REFUSED = [
    ({"tenant": "globex"}, 400, "unknown_field", "tenant is the API key's"),
    ({"extra_key": "semgov1.x.y"}, 400, "unknown_field", "extra_key"),
    ({"rid": "mine"}, 400, "unknown_field", "rid"),
    ({"temperature": 1.0}, 400, "unknown_field", "temperature"),
    ({"calibration": {"run": "r1", "role": "judge"}}, 400, "claim_malformed", "calibration.role"),
    ({"calibration": {"run": "r1", "role": "donor", "plan": "trailing:128"}}, 400, "claim_malformed",
     "calibration.plan"),
    ({"calibration": {"run": "r1", "role": "recipient"}}, 400, "claim_malformed", "calibration.plan"),
    ({"calibration": {"run": "a/b", "role": "cold"}}, 400, "claim_malformed", "calibration.run"),
    ({"calibration": {"run": "r1", "role": "cold", "tenant": "globex"}}, 400, "claim_malformed",
     "{run, role[, plan]}"),
    ({"calibration": {"run": "r1", "role": 3}}, 400, "claim_malformed", "calibration.role"),
    ({"calibration": None}, 400, "claim_missing", "calibration"),
    ({"namespace": "globex/q3"}, 403, "namespace", "globex/q3"),
    ({"namespace": None}, 400, "claim_missing", "namespace"),
    ({"namespace": "acme/q3/semgov-calibration/r0"}, 400, "claim_malformed", "/semgov-calibration/"),
    ({"namespace": _LONG_BASE, "calibration": {"run": "r" * 8, "role": "cold"}}, 400, "claim_malformed",
     "133 characters"),
    ({"task": {"id": "qa", "version": "2"}}, 403, "task", "qa"),
    ({"max_new_tokens": 0}, 400, "field", "max_new_tokens"),
    ({"max_new_tokens": 4097}, 400, "field", "max_new_tokens"),
    ({"max_new_tokens": True}, 400, "field", "max_new_tokens"),
    ({"max_new_tokens": "16"}, 400, "field", "max_new_tokens"),
    ({"request_id": "has space"}, 400, "field", "request_id"),
    ({"request_id": "x" * 65}, 400, "field", "request_id"),
    ({"input_ids": IDS * 3}, 413, "prompt_size", "over this gateway's 100"),
    ({"input_ids": []}, 400, "prompt", "input_ids"),
    ({"input_ids": [1, 2, 49152]}, 400, "token_id", "input_ids"),
    ({"input_ids": [1, True, 3]}, 400, "token_id", "input_ids"),
    ({"segments": [["evidence", 0, 40], ["question", 40, 40]]}, 400, "segments", "segments[1]"),
    ({"segments": [["evidence", 0, 30]]}, 400, "segments", "end at 30"),
    ({"segments": [["evidence", 5, 40]]}, 400, "segments", "segments[0]"),
    ({"segments": [["notes", 0, 40]]}, 400, "segments", "role"),
    ({"segments": [{"role": "evidence", "start": 0, "end": 40}]}, 400, "segments", "segments[0]"),
]  # fmt: skip


@pytest.mark.parametrize(("over", "status", "reason", "needle"), REFUSED)
def test_a_bad_request_is_refused_naming_the_problem_and_nothing_is_sent(
    tmp_path: Path, over: dict[str, Any], status: int, reason: str, needle: str
) -> None:
    """Another tenant, a bad claim, an unknown field, a big prompt, a foreign namespace: 4xx, no forward."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        sent = {**body(), **over}
        r = await c.post(ROUTE, json={k: v for k, v in sent.items() if v is not None}, headers=auth())
        assert r.status_code == status, r.text
        assert needle in r.json()["error"]["message"], r.text
        assert fake.bodies == []
        assert f'semgov_gateway_refusals_total{{reason="{reason}"}} 1.0' in await refusals(c)

    run(tmp_path, scenario, options=GatewayOptions(calibrate=("acme",), max_prompt_chars=100))


def test_a_body_over_the_gateways_limit_is_refused_unread(tmp_path: Path) -> None:
    """A calibration body past --max-body-mb gets 413 body_size, as on every route."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, json=body(input_ids=list(range(5000))), headers=auth())
        assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
        assert fake.bodies == []

    run(tmp_path, scenario, options=CAL, max_body_bytes=4096)


def test_vllm_answers_501_saying_calibration_is_sglang_only(tmp_path: Path) -> None:
    """With --engine vllm the route answers 501 in the OpenAI error form, saying why; nothing is sent."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, json=body(), headers=auth())
        assert r.status_code == 501, r.text
        err = r.json()["error"]
        assert err["code"] == 501 and "SGLang only" in err["message"] and "shifted span" in err["message"]
        assert fake.bodies == []
        assert 'semgov_gateway_refusals_total{reason="calibration_engine"} 1.0' in await refusals(c)

    run(tmp_path, scenario, engine="vllm", options=CAL)


_META = {"id": None, "finish_reason": {"type": "stop"}, "prompt_tokens": 40, "completion_tokens": 2}
MALFORMED = [
    b"not json",
    b'{"text": "x", "output_ids": [1, 2]}',
    json.dumps({"output_ids": ["a"], "meta_info": _META}).encode(),
    json.dumps({"output_ids": list(range(17)), "meta_info": _META}).encode(),
    json.dumps({"output_ids": [-1], "meta_info": _META}).encode(),
    json.dumps({"output_ids": [1], "text": 7, "meta_info": _META}).encode(),
    json.dumps({"output_ids": [1], "meta_info": {**_META, "id": "someone-else"}}).encode(),
    json.dumps({"output_ids": [1], "meta_info": {**_META, "prompt_tokens": "40"}}).encode(),
    json.dumps({"output_ids": [1], "meta_info": {**_META, "cached_tokens": -1}}).encode(),
    json.dumps({"output_ids": [1], "meta_info": {**_META, "finish_reason": {"type": 5}}}).encode(),
    json.dumps([{"output_ids": [1], "meta_info": _META}, {"output_ids": [1], "meta_info": _META}]).encode(),
    b'{"output_ids": [1], "output_ids": [2], "meta_info": {}}',
    b'{"output_ids": [1], "text": "\\ud800", "meta_info": {"prompt_tokens": 1, "completion_tokens": 1}}',
    b'{"output_ids": [1], "text": "' + b"x" * (4 << 20) + b'", "meta_info": {}}',
]


@pytest.mark.parametrize("answer", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_engine_answer_is_502(tmp_path: Path, answer: bytes) -> None:
    """An answer that is not this request's generation (types, bounds, another rid) is 502 upstream_error."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, json=body(), headers=auth())
        assert r.status_code == 502, r.text
        assert r.json()["error"]["type"] == "upstream_error" and len(fake.bodies) == 1
        assert 'outcome="upstream_error",route="calibrate",tenant="acme"} 1.0' in await refusals(c)

    run(tmp_path, scenario, options=GatewayOptions(calibrate=("acme",), generate_answer=answer))


def test_a_well_formed_answer_without_optional_fields_passes() -> None:
    """An answer without text, cached_tokens or finish reason reads as nulls (the 502s' control)."""
    from semgov.gateway.calibration import answer_of

    raw = json.dumps([{"output_ids": [5], "meta_info": {"prompt_tokens": 4, "completion_tokens": 1}}])
    doc = answer_of(raw.encode(), rid="r", max_new_tokens=1)
    meta = {"prompt_tokens": 4, "completion_tokens": 1, "cached_tokens": None, "finish_reason": None}
    assert doc == {"request_id": "r", "output_ids": [5], "text": None, "meta_info": meta}


@pytest.mark.parametrize(("mode", "status", "outcome"), [("status:400", 400, "engine_refused"),
                         ("status:503", 503, "engine_refused"), ("status:500", 502, "upstream_error"),
                         ("slow", 504, "timeout")])  # fmt: skip
def test_engine_failures_map_as_on_every_route(tmp_path: Path, mode: str, status: int, outcome: str) -> None:
    """The engine's 400 stays 400, 503 stays 503, a 500 is 502 and silence past --timeout-s is 504."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, json=body(), headers=auth())
        assert r.status_code == status, r.text
        assert f'outcome="{outcome}",route="calibrate",tenant="acme"}} 1.0' in await refusals(c)

    run(tmp_path, scenario, mode=mode, timeout_s=1, options=CAL)


def test_the_routing_key_is_the_runs_scope_and_set_by_the_gateway_only(tmp_path: Path) -> None:
    """A run's donor and recipient share one routing key, another run's differs; a client's is dropped."""
    options = GatewayOptions(calibrate=("acme",), routing_key_header="x-smg-routing-key")

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        forged = {**auth(), "x-smg-routing-key": "f" * 32}
        donor = body(input_ids=IDS[5:], segments=None, calibration={"run": "r1", "role": "donor"})
        other = body(calibration={"run": "r2", "role": "cold"})
        for doc in (donor, body(), other):
            r = await c.post(ROUTE, json=doc, headers=forged)
            assert r.status_code == 200, r.text
        keys = [h["x-smg-routing-key"] for h in fake.headers]
        secret = routing_secret(b"k" * 32)
        assert keys[0] == keys[1] == routing_key(secret, "acme", "acme/q3/semgov-calibration/r1", (), ())
        assert keys[2] == routing_key(secret, "acme", "acme/q3/semgov-calibration/r2", (), ())
        assert keys[2] != keys[0] and "f" * 32 not in keys

    run(tmp_path, scenario, options=options)


def test_without_the_routing_header_setting_no_routing_key_is_sent(tmp_path: Path) -> None:
    """Without --routing-key-header the client's header is not forwarded either."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, json=body(), headers={**auth(), "x-smg-routing-key": "f" * 32})
        assert r.status_code == 200, r.text
        assert "x-smg-routing-key" not in fake.headers[0]

    run(tmp_path, scenario, options=CAL)


@pytest.mark.parametrize(
    ("key_id", "request_id"),
    [("acme-app", "r1.donor"), ("k" * 128, "x" * 64), ("ключ", "a"), ("a b/c.d", "r_1-2.3")],
)
def test_the_rid_is_a_label_the_hook_records_as_is(key_id: str, request_id: str) -> None:
    """The rid is at most 128 label characters, so request_label keeps it as sent; it ends with the id."""
    rid = engine_rid(key_id, request_id)
    assert RID.fullmatch(rid) and len(rid) <= 128, rid
    assert request_label(rid) == rid and rid.endswith("-" + request_id)


def test_two_keys_ids_never_give_one_rid() -> None:
    """Ids a plain join would confuse, and ids alike in their readable part, give distinct rids."""
    assert engine_rid("a-b", "c") != engine_rid("a", "b-c")
    assert engine_rid("ключ1", "r") != engine_rid("ключ2", "r")
    assert engine_rid("k" * 12 + "x", "r") != engine_rid("k" * 12 + "y", "r")
    assert engine_rid("acme.app", "r") != engine_rid("acme_app", "r")
    assert engine_rid("acme-app", "r") == engine_rid("acme-app", "r")


def test_the_calibrate_field_is_a_boolean_defaulting_to_false(tmp_path: Path) -> None:
    """`calibrate` must be true or false (a string is refused, naming the line); absent, it is false."""
    from semgov.errors import InputError
    from semgov.gateway.tenants import load_tenants

    p = tmp_path / "tenants.yaml"
    p.write_text(tenants_yaml(calibrate=("acme",)))
    loaded = {k.tenant: k.calibrate for k in load_tenants(p).by_hash.values()}
    assert loaded == {"acme": True, "globex": False}
    p.write_text(tenants_yaml(calibrate=("acme",)).replace("calibrate: true", 'calibrate: "yes"'))
    with pytest.raises(InputError) as e:
        load_tenants(p)
    assert "calibrate" in str(e.value) and e.value.line == 11


def test_gateway_key_calibrate_writes_the_field_and_check_names_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`semgov gateway key --calibrate` writes calibrate: true; `gateway check` lists the keys that may."""
    args = ["gateway", "key", "--id", "cal-app", "--tenant", "acme", "--namespace", "acme/*", "--task",
            "qa@1", "--contract", f"answer-json@{'a' * 64}"]  # fmt: skip
    assert main([*args, "--calibrate"]) == 0
    entry = json.loads(capsys.readouterr().err.split("  - ", 1)[1])
    assert entry["calibrate"] is True
    assert main([*args[:2], "--id", "plain-app", *args[4:]]) == 0
    plain = json.loads(capsys.readouterr().err.split("  - ", 1)[1])
    assert "calibrate" not in plain
    p = tmp_path / "tenants.yaml"
    p.write_text("version: 1\nkeys:\n  - " + json.dumps(entry) + "\n  - " + json.dumps(plain) + "\n")
    assert main(["gateway", "check", str(p)]) == 0
    out = capsys.readouterr().out
    assert "OK (2 keys, 1 tenants)" in out and "may calibrate (1 keys): cal-app" in out
    p.write_text("version: 1\nkeys:\n  - " + json.dumps(plain) + "\n")
    assert main(["gateway", "check", str(p)]) == 0
    assert "may calibrate: no key" in capsys.readouterr().out


@pytest.mark.parametrize(
    "raw",
    [
        b'{"request_id": "a", "namespace": "globex/q3", "namespace": "acme/q3"}',
        json.dumps(body()).encode()[:-1] + b', "max_new_tokens": NaN}',
        json.dumps(body()).encode()[:-1] + b', "request_id": "again"}',
        json.dumps({**body(), "input_ids": [1] * 3}).encode().replace(b"[1, 1, 1]", b"[" * 40 + b"]" * 40),
        b"[" * 10_000,
    ],
    ids=["duplicate-namespace", "nan", "duplicate-request-id", "deep", "deep-unclosed"],
)
def test_a_body_that_is_not_one_strict_json_object_is_400(tmp_path: Path, raw: bytes) -> None:
    """Duplicate keys (one meaning per body), NaN and deep nesting are 400 here too; nothing is sent."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(ROUTE, content=raw, headers={**auth(), "content-type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and fake.bodies == []

    run(tmp_path, scenario, options=CAL)


def test_the_log_line_names_the_engine_rid_and_no_secret(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A calibration request logs route calibrate and its engine rid, never the API key or the token."""
    monkeypatch.setattr(log, "_pending", None)  # NOTE: restored after the test, as configure() set it
    log.configure("json")
    tokens: list[str] = []

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        assert (await c.post(ROUTE, json=body(), headers=auth())).status_code == 200
        tokens.extend(b["extra_key"] for b in fake.bodies)

    run(tmp_path, scenario, options=CAL)
    err = capsys.readouterr().err
    (line,) = [json.loads(x) for x in err.splitlines() if '"gateway request"' in x]
    assert line["route"] == "calibrate" and line["engine_rid"] == engine_rid(
        "acme-app", "r1.recipient.bookend"
    )
    assert line["n_prompt_tokens"] == len(IDS) and line["tenant"] == "acme"
    for needle in (KEYS["acme"], *tokens):
        assert needle not in err


_text = st.sampled_from(
    [
        "acme/q3",
        "globex/q3",
        "acme/*",
        "r1",
        "donor",
        "cold",
        "recipient",
        "release",
        "bookend:16+256",
        "trailing:128",
        "tenant",
        "\ud800",
        "",
        "a/b",
    ]
) | st.text(max_size=10)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _text,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_text, kids, max_size=4),
    max_leaves=8,
)
_claim = st.fixed_dictionaries(
    {"run": st.sampled_from(["r1", "r-2", "a/b", "x" * 49]) | _json,
     "role": st.sampled_from(["donor", "cold", "recipient", "release", "judge"]) | _json},
    optional={"plan": st.sampled_from(["bookend:16+256", "trailing:128", "BAD"]) | _json},
) | _json  # fmt: skip
_overlay = st.fixed_dictionaries(
    {},
    optional={
        "request_id": st.sampled_from(["a", "r.1-x_y", "x" * 65, "a b"]) | _json,
        "input_ids": st.lists(st.integers(-1, 50_000), min_size=0, max_size=6) | _json,
        "segments": st.lists(st.tuples(st.sampled_from(ROLES), st.integers(-1, 41), st.integers(-1, 41))
                             .map(list), max_size=3) | _json,
        "namespace": st.sampled_from(["acme/q3", "globex/q3", "acme/q3/semgov-calibration/r9"]) | _json,
        "task": st.sampled_from([TASK, {"id": "qa", "version": "2"}]) | _json,
        "response_contract": st.just(CONTRACT) | _json,
        "calibration": _claim,
        "max_new_tokens": st.integers(-1, 4100) | _json,
        "tenant": _json,
        "sampling_params": _json,
    },
)  # fmt: skip


def test_any_body_is_below_500_and_what_is_sent_is_the_keys_greedy_calibration(tmp_path: Path) -> None:
    """Arbitrary overlays on a served body: below 500; what reaches SGLang is the key's tenant, the
    run's namespace, the claim, greedy; a key without calibrate: true never reaches it."""
    loop = asyncio.new_event_loop()
    gateway = serving(tmp_path, options=CAL)
    c, fake, _ = loop.run_until_complete(gateway.__aenter__())
    statuses: set[int] = set()
    keys = ContextKeys(b"k" * 32, AUDIENCE)

    @settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(tenant=st.sampled_from(["acme", "globex"]), overlay=_overlay)
    def check(tenant: str, overlay: dict[str, Any]) -> None:
        before = len(fake.bodies)
        doc = {**body(namespace=f"{tenant}/q3"), **overlay}
        r = loop.run_until_complete(c.post(ROUTE, content=json.dumps(doc).encode(), headers=auth(tenant)))
        got = fake.bodies[before:]
        statuses.add(r.status_code)
        assert r.status_code < 500, r.text[:300]
        if r.status_code != 200:
            assert got == [] and r.json()["error"]["code"] == r.status_code, r.text[:300]
            return
        (sent,) = got
        ctx = parse_context_token(keys, sent["extra_key"])
        assert tenant == ctx.tenant == "acme" and ctx.calibration is not None
        assert ctx.namespace == calibration_namespace(str(doc["namespace"]), ctx.calibration.run)
        assert ctx.namespace.startswith("acme/") and ctx.namespace.count("/semgov-calibration/") == 1
        assert sent["sampling_params"] == {"temperature": 0, "max_new_tokens": doc["max_new_tokens"]}
        assert sent["rid"] == r.json()["request_id"] == engine_rid("acme-app", doc["request_id"])

    try:
        check()
    finally:
        loop.run_until_complete(gateway.__aexit__(None, None, None))
        loop.close()
    assert {200, 400, 403} <= statuses, statuses  # NOTE: served, malformed and unauthorized were all explored
