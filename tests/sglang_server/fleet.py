"""A fleet on one machine: real SGLang CPU workers behind the engines' own router (``smg``), and the
real ``semgov gateway`` in front of the router.

client -> ``semgov gateway --upstream-api generate [--routing-key-header x-smg-routing-key]`` ->
``smg launch --worker-urls A B --policy P`` -> two SGLang CPU servers with the hook, each pinned to
one core (``taskset`` and SGLang's own OMP binding), each with its own audit log and origin.

The router is found at ``SEMGOV_SMG``, else ``.venv-smg/bin/smg`` (``.ci/run`` makes it), else on
``PATH``. Nothing here imports SGLang or the router: the rig is a client, for tests and benchmarks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.fixtures import KEYS, tenants_yaml, tokenizer_dir
from tests.sglang_server.rig import (
    AUDIENCE,
    ROOT,
    TINY_MODEL,
    HookFiles,
    RigError,
    Server,
    ServerConfig,
    free_port,
    run_concurrently,
    settle,
    stop_group,
)

ROUTING_HEADER = "x-smg-routing-key"  # smg's own routing-key header (consistent_hashing reads it)
SMG_VERSION = "1.13.0"


def smg_binary() -> Path | None:
    """The router's executable, if installed (``SEMGOV_SMG``, ``.venv-smg``, ``PATH``)."""
    for candidate in (
        os.environ.get("SEMGOV_SMG"),
        str(ROOT / ".venv-smg" / "bin" / "smg"),
        shutil.which("smg"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def model_dir(directory: Path) -> Path:
    """The tiny model's config with SmolLM2's tokenizer files (same 49,152-token vocabulary)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(TINY_MODEL / "config.json", directory / "config.json")
    for f in tokenizer_dir().iterdir():
        if f.is_file() and f.name != "semgov-source.json":
            shutil.copy(f, directory / f.name)
    return directory


def worker_config(model: Path, index: int, cores: int) -> ServerConfig:
    """Worker ``index``: the tiny model, its own audit origin, one core (``index`` mod ``cores``)."""
    core = str(index % cores)
    return ServerConfig(
        model=model, dummy_weights=False, page_size=1, chunked_prefill_size=1024,
        # NOTE: --log-requests at level 0 names each request's rid (no ids, no text): which worker served it
        extra_args=("--load-format", "dummy", "--served-model-name", "tiny", "--log-requests",
                    "--log-requests-level", "0"),
        hook_env={"SEMGOV_AUDIT_ORIGIN": f"semgov-fleet/worker-{index}", "SGLANG_CPU_OMP_THREADS_BIND": core,
                  "OMP_NUM_THREADS": "1"},
        launcher=("taskset", "-c", core) if shutil.which("taskset") else (),
    )  # fmt: skip


@dataclass
class Router:
    """A running ``smg launch`` in a process group of its own."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    policy: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        stop_group(self.proc, term_wait_s=5.0)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def start_router(smg: Path, urls: Sequence[str], policy: str, work: Path) -> Router:
    """``smg launch`` over ``urls`` with ``policy``; consistent hashing reads ``x-smg-routing-key``.

    Health is probed every second and one failure marks a worker unhealthy, so a killed worker
    leaves the ring within seconds. ``--no-remove-unhealthy-workers``: an unhealthy worker stays
    registered and is probed on, so a restarted one is back at its first good probe (smg's
    default without service discovery, "auto recovery", removes it for discovery to re-add)."""
    work.mkdir(parents=True, exist_ok=True)
    port, log = free_port(), work / "router.log"
    cmd = [str(smg), "launch", "--worker-urls", *urls, "--policy", policy, "--host", "127.0.0.1",
           "--port", str(port), "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
           "--health-check-interval-secs", "1", "--health-failure-threshold", "1",
           "--health-success-threshold", "1", "--no-remove-unhealthy-workers",
           "--shutdown-grace-period-secs", "1", "--log-level", "warn"]  # fmt: skip
    (work / "command.txt").write_text(" ".join(cmd) + "\n")
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    router = Router(proc, port, log, policy)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RigError(f"the router exited (rc {proc.returncode}):\n{router.tail()}")
        try:
            if len(healthy_workers(router)) == len(urls):
                return router
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.3)
    router.stop()
    raise RigError(f"the router did not register {len(urls)} workers in 60 s:\n{router.tail()}")


def healthy_workers(router: Router) -> list[str]:
    """The worker URLs the router lists as healthy (``GET /workers``)."""
    doc = httpx.get(router.url + "/workers", timeout=5).json()
    return [str(w["url"]) for w in doc["workers"] if w.get("is_healthy", True)]


@dataclass
class GatewayProc:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def post(self, body: Any, tenant: str = "acme", headers: dict[str, str] | None = None) -> httpx.Response:
        hdrs = {"authorization": f"Bearer {KEYS[tenant]}", **(headers or {})}
        return httpx.post(self.url + "/v1/chat/completions", json=body, headers=hdrs, timeout=300)


def start_gateway(upstream: str, context_key: Path, work: Path, routing: bool) -> GatewayProc:
    """The real ``semgov gateway serve`` in front of ``upstream`` (a router: ``/generate``)."""
    work.mkdir(parents=True, exist_ok=True)
    tenants = work / "tenants.yaml"
    tenants.write_text(tenants_yaml())
    port, log = free_port(), work / "gateway.log"
    cmd = [sys.executable, "-m", "semgov.cli.main", "gateway", "serve", "--tenants", str(tenants),
           "--context-key", str(context_key), "--audience", AUDIENCE, "--engine", "sglang",
           "--upstream", upstream, "--upstream-api", "generate", "--model", "tiny",
           "--tokenizer", str(tokenizer_dir()), "--port", str(port), "--timeout-s", "300",
           *(("--routing-key-header", ROUTING_HEADER) if routing else ())]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with log.open("wb") as err:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=str(ROOT), start_new_session=True
        )
    gw = GatewayProc(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RigError(f"the gateway exited (rc {proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(gw.url + "/health", timeout=2).status_code == 200:
                return gw
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RigError(f"no gateway /health after 120 s:\n{log.read_text()[-3000:]}")


@dataclass
class Fleet:
    """Workers, the router over them, the gateway in front."""

    workers: list[Server]
    router: Router
    gateway: GatewayProc
    work: Path
    restarts: dict[int, int] = field(default_factory=dict)

    def settle(self) -> None:
        for w in self.workers:
            if w.alive():
                settle(w)

    def restart(self, index: int) -> None:
        """Start worker ``index`` again on its port, with its audit log (its old server log kept)."""
        w = self.workers[index]
        w.stop()
        self.restarts[index] = self.restarts.get(index, 0) + 1
        if w.log_path.exists():
            w.log_path.rename(w.log_path.with_suffix(f".{self.restarts[index]}.log"))
        w.start()


def start_workers(model: Path, work: Path, n: int) -> list[Server]:
    """``n`` workers started at once (each pinned to a core), every one healthy, or none left running."""
    cores = max(1, min(n, os.cpu_count() or 1))
    servers = [
        Server(
            worker_config(model, i, cores),
            work / f"worker-{i}",
            HookFiles.make(work / f"worker-{i}" / "hook"),
            free_port(),
        )
        for i in range(n)
    ]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=n) as ex:
        futures = [ex.submit(s.start) for s in servers]
        errors = [f.exception() for f in futures]
    if any(errors):
        for s in servers:
            s.stop()
        raise RigError(f"a worker did not start: {next(e for e in errors if e)}")
    return servers


@contextmanager
def fleet(
    work: Path, n_workers: int = 2, policy: str = "consistent_hashing", routing: bool = True
) -> Iterator[Fleet]:
    """A started fleet; every process stopped (by process group) on exit, whatever happened."""
    smg = smg_binary()
    if smg is None:
        raise RigError("no smg router (SEMGOV_SMG, .venv-smg or PATH; ../shared/RECIPES.md)")
    model = model_dir(work / "model")
    with ExitStack() as stack:
        workers = start_workers(model, work, n_workers)
        stack.callback(lambda: run_concurrently([w.stop for w in workers], workers=len(workers)))
        urls = [f"http://{w.host}:{w.port}" for w in workers]
        router = start_router(smg, urls, policy, work / "router")
        stack.callback(router.stop)
        gw = start_gateway(router.url, workers[0].files.context_key, work / "gateway", routing)
        stack.callback(lambda: stop_group(gw.proc, term_wait_s=10.0))
        yield Fleet(workers, router, gw, work)


def worker_of(fleet_: Fleet, request_id: str) -> int | None:
    """Which worker served ``request_id`` (the hook's audit records and SGLang's log name it)."""
    for i, w in enumerate(fleet_.workers):
        if request_id in w.log_text():
            return i
    return None


def replace_config(config: ServerConfig, **kw: Any) -> ServerConfig:
    return replace(config, **kw)
