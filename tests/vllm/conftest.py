"""The real vLLM server the vLLM tests share (started once per session, on first use).

One server carries both parts of semgov for vLLM: the scope middleware (``test_vllm_server.py``)
and the governed connector (``test_connector_server.py``), with the K/V dump diagnostic on and a
1 MiB body limit (the middleware's 413). Its KV cache is 40 blocks of 128 tokens (5,120 tokens;
prompts up to 2,048): enough for the sequential pairs, small enough that concurrent traffic makes
vLLM preempt (the preemption test asserts it did). ``--enforce-eager`` skips vLLM's torch.compile
warm-up (about 11 s of a 50 s start on two cores): the tests check mechanics, not speed. One
server start is about 40 s of CI time.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from tests.vllm.rig import VllmServer, VllmServerConfig, launch_vllm, require_vllm_python


def _vllm_bases() -> None:
    """Without vLLM (semgov's environment), its two empty connector metadata base classes as plain
    classes, so the connector's sides import (nothing else of vLLM is used by them)."""
    if "vllm.distributed.kv_transfer.kv_connector.v1.base" in sys.modules:
        return
    try:
        import vllm  # noqa: F401
    except ImportError:
        mod = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.base")
        mod.KVConnectorMetadata = type("KVConnectorMetadata", (), {})  # type: ignore[attr-defined]
        mod.KVConnectorWorkerMetadata = type("KVConnectorWorkerMetadata", (), {})  # type: ignore[attr-defined]
        sys.modules[mod.__name__] = mod


_vllm_bases()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    work = tmp_path_factory.mktemp("vllm-server")
    cfg = VllmServerConfig(
        kv_dump=True,
        eager=True,
        num_blocks=40,
        max_model_len=2048,
        hook_env={"SEMGOV_MAX_BODY_MB": "1"},  # the rig's servers hold a previous context key too
    )
    with launch_vllm(cfg, work, require_vllm_python()) as s:
        yield s
        assert s.fatal_lines() == [], s.tail()
