"""Fixtures of the real-server rig: real SGLang servers on CPU, one per configuration, shared.

Every test under ``tests/sglang_server/`` is marked ``sglang_server`` (and ``sglang``). A server
start costs 25-50 s on two cores, so each configuration of :func:`~tests.sglang_server.rig.
server_configs` is started once per session, on first use, and shared by the tests that ask for
it by name (their request ids are unique, and each reads only its own audit records); all are
stopped, by process group and all at once (each stop takes seconds), when the session ends. Every
test still checks, after its own traffic, that its server is alive, that its log has no crash,
leak or invariant line, and that the audit log holds no ``invariant_violation`` event
(:func:`assert_healthy`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.sglang_server.rig import Server, launch, read_audit, run_concurrently, server_configs, summarize


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(here):
            item.add_marker(pytest.mark.sglang_server)
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Server]]:
    """``servers(name)``: the running server of that configuration, started on first use."""
    configs = server_configs("cpu")
    started: dict[str, Server] = {}
    running: list[AbstractContextManager[Server]] = []

    def get(name: str) -> Server:
        if name not in started:
            cm = launch(configs[name], tmp_path_factory.mktemp(f"server-{name}"))
            started[name] = cm.__enter__()  # NOTE: a failed start stops its own server (launch)
            running.append(cm)
        return started[name]

    try:
        yield get
    finally:
        stops = [lambda cm=cm: cm.__exit__(None, None, None) for cm in running]
        run_concurrently(stops, workers=max(1, len(stops)))


def assert_healthy(server: Server) -> None:
    """The server is up, answers /health, its log holds no crash/leak/violation, its audit no violation."""
    assert server.alive(), f"the server died:\n{server.tail()}"
    assert server.healthy(timeout=60), f"/health failed:\n{server.tail()}"
    bad = server.fatal_lines()
    assert not bad, "server log:\n" + "\n".join(bad[:20]) + "\n" + server.tail(80)
    audit = summarize(read_audit(server.files.audit_dir, wait_s=20))
    assert not audit.violations, [v.get("detail") for v in audit.violations]
