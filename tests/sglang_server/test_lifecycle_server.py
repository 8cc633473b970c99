"""Request lifecycles a real SGLang server puts the backend through: aborts, flushes, retraction.

Servers (:func:`tests.sglang_server.rig.server_configs`): ``page1-overlap`` for aborts, flushes,
rids and hostile keys; ``retract`` runs SGLang's own retraction test mode
(``SGLANG_TEST_RETRACT=1``: every third decode step retracts requests, the path a full KV pool
takes); ``pressure`` has a pool too small for its traffic (donors evicted between decision and
admission, a real pool-full retraction).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_server import scenarios
from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import Server


@pytest.fixture
def server(servers: Any) -> Server:
    srv: Server = servers("page1-overlap")
    return srv


@pytest.fixture
def retract(servers: Any) -> Server:
    srv: Server = servers("retract")
    return srv


@pytest.fixture
def small(servers: Any) -> Server:
    srv: Server = servers("pressure")
    return srv


def test_aborts_mid_prefill_and_mid_decode(server: Server) -> None:
    """Client disconnects while waiting, prefilling or decoding, and /abort_request: nothing breaks."""
    out = scenarios.aborts(server, "ab")
    assert not out.problems, out.problems
    assert_healthy(server)


def test_flush_cache_under_load(server: Server) -> None:
    """/flush_cache during traffic is refused until idle, then flushes; reuse resumes with new donors."""
    out = scenarios.flush_under_load(server, "fl")
    assert not out.problems, out.problems
    assert_healthy(server)


def test_retraction_decides_once(retract: Server) -> None:
    """A retracted recipient keeps its one set of signed decisions and is realized again under it."""
    out = scenarios.retraction(retract, "rt")
    assert not out.problems, out.problems
    assert_healthy(retract)


def test_client_rids_key_nothing(server: Server) -> None:
    """Two live requests with one rid, and another tenant reusing a donor's rid, share nothing."""
    out = scenarios.rid_collisions(server, "rid")
    assert not out.problems, out.problems
    assert_healthy(server)


def test_hostile_extra_keys_keep_the_scheduler_up(server: Server) -> None:
    """Non-ASCII, lone surrogates, junk after a valid token, 200 kB keys: served cold, server up."""
    out = scenarios.hostile_extra_keys(server, "hx")
    assert not out.problems, out.problems
    assert_healthy(server)


def test_a_context_key_rotation_keeps_each_tenant_in_its_own_scope(server: Server) -> None:
    """Previous-key tokens keep their tenant's scope during a rotation; refused tokens share nothing."""
    out = scenarios.rotation(server, "rot")
    assert not out.problems, out.problems
    assert_healthy(server)


def test_memory_pressure_evicts_donors_and_retracts(small: Server) -> None:
    """A pool too small for the traffic: eviction and retraction, accounting intact, server up."""
    out = scenarios.pressure(small, "pr")
    assert not out.problems, (out.problems, out.notes)
    assert_healthy(small)
