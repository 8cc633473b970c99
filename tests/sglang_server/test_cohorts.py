"""The paired cohorts on a real SGLang server: allowed pairs realized, everything else cold.

Two servers: page size 1 with overlap scheduling (SGLang's CPU default) and page size 16 with
``--disable-overlap-schedule``, both with chunked prefill (1,024) well below the prompt length
(2,336 tokens). Per cohort (donor ``[S][I][E][Q1]``, recipient ``[S][E][Q2]``, E shifted by
``len(I)``; :func:`tests.sglang_server.scenarios.cohorts`):

- ``allowed``: same tenant and namespace: the recipient's E is realized from the donor (a
  shifted span) and SGLang reports it as host-hit tokens;
- ``other_tenant``: never a candidate (no decision), cold;
- ``unrelated``: same scope, other evidence: decided, denied by token verification, cold;
- ``no_context``: no token: no decision, exact-prefix reuse only.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.sglang_server import scenarios
from tests.sglang_server.conftest import assert_healthy
from tests.sglang_server.rig import Server


@pytest.fixture(params=["page1-overlap", "page16-no-overlap"])
def server(request: pytest.FixtureRequest, servers: Any) -> Server:
    srv: Server = servers(request.param)
    return srv


def test_cohorts_realize_only_allowed_pairs(server: Server) -> None:
    """Allowed pairs are realized (evidence length, as SGLang host hits); other cohorts stay cold."""
    out = scenarios.cohorts(server, f"c{server.config.page_size}", pairs=2)
    assert not out.problems, out.problems
    assert out.realizations == 2 and out.realized_tokens == 2 * 2048
    assert_healthy(server)


def test_concurrency_mixes_recipients_donors_and_plain_traffic(server: Server) -> None:
    """40 requests in flight (recipients, new donors, plain, other tenant): only recipients realize."""
    out = scenarios.concurrency(server, f"q{server.config.page_size}")
    assert not out.problems, out.problems
    assert out.realizations == 10
    assert_healthy(server)


def test_evidence_behind_a_new_wrapper_is_realized_mid_prompt(server: Server) -> None:
    """Evidence approved after fresh tokens is realized between prefill chunks (two regions too)."""
    out = scenarios.regions(server, f"g{server.config.page_size}")
    assert not out.problems, out.problems
    assert out.realizations == 2 + 4 and out.realized_tokens == 1024 + 4 * 1024
    assert_healthy(server)
