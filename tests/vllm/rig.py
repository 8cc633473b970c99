"""The real-server rig for vLLM: a real vLLM 0.32 OpenAI server on CPU with semgov's connector.

What is real: ``python -m vllm.entrypoints.openai.api_server`` (API server process, engine core
process with vLLM's scheduler and CPU worker), its prefix cache, its V1 KV connector API, with
semgov's scope middleware and connector exactly as a user configures them, and the hook's audit
log. The rig is a client: it imports neither vLLM nor torch, so pytest (in semgov's environment)
and the server check drive a server running in vLLM's own environment (``.venv-vllm``).

Shared with the SGLang rig (:mod:`tests.sglang_server.rig`): the hook's files (keys, keyring,
gateway key, rig policy, audit directory), the gateway, the prompts and the audit summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.sglang_server.rig import (
    CONTEXT_SECRET,
    AuditSummary,
    Gateway,
    HookFiles,
    RigError,
    free_port,
    read_audit,
    stop_group,
    summarize,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "vllm" / "tiny_llama_hd64"
CONNECTOR = {
    "kv_connector": "SemgovConnector",
    "kv_connector_module_path": "engine_hooks.vllm.connector",
    "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute",
}
FATAL = ("Traceback (most recent call last)", "EngineCore encountered a fatal error", "EngineDeadError")


def vllm_python() -> Path | None:
    """The vLLM environment's interpreter (``SEMGOV_VLLM_PYTHON`` or ``.venv-vllm``), if present."""
    py = Path(os.environ.get("SEMGOV_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
    return py if py.exists() else None


def require_vllm_python() -> Path:
    """The vLLM interpreter for a test: skipped without one, failed under CI (which must have it)."""
    import pytest

    py = vllm_python()
    if py is None:
        if os.environ.get("CI"):
            pytest.fail("no vLLM environment at .venv-vllm (.ci/run makes it) or SEMGOV_VLLM_PYTHON")
        pytest.skip("no vLLM environment (see .ci/run: .venv-vllm)")
    return py


@dataclass
class VllmServerConfig:
    """How one vLLM server is launched."""

    model: Path = TINY
    dummy_weights: bool = True
    connector: bool = True  # semgov's connector; False: stock vLLM (with the scope middleware)
    prefix_caching: bool = True
    kv_cache_gib: str = "1"  # on CPU: VLLM_CPU_KVCACHE_SPACE
    device: str = "cpu"  # "cpu" (vLLM's CPU build) or "cuda" (its CUDA build, GPU attention backends)
    gpu_memory_utilization: float = 0.4  # on CUDA: vLLM's share of the GPU's memory
    num_blocks: int | None = None  # --num-gpu-blocks-override: a small pool forces preemption
    max_num_seqs: int | None = None
    max_model_len: int = 4096
    hook_env: dict[str, str] = field(default_factory=dict)
    kv_dump: bool = False
    eager: bool = False  # --enforce-eager: no torch.compile warm-up (a faster start; tests)
    dtype: str | None = None  # --dtype; None: vLLM's default for the model
    connector_module: str = CONNECTOR["kv_connector_module_path"]  # where vLLM finds SemgovConnector
    startup_timeout_s: float = 600.0

    def args(self, port: int) -> list[str]:
        a = ["--model", str(self.model), "--host", "127.0.0.1", "--port", str(port),
             "--max-model-len", str(self.max_model_len), "--seed", "0",
             "--middleware", "engine_hooks.vllm.scope.ScopeSalt"]  # fmt: skip
        if self.dummy_weights:
            a += ["--load-format", "dummy", "--skip-tokenizer-init"]
        a += ["--enable-prefix-caching"] if self.prefix_caching else ["--no-enable-prefix-caching"]
        if self.connector:
            a += [
                "--kv-transfer-config",
                json.dumps({**CONNECTOR, "kv_connector_module_path": self.connector_module}),
            ]
        if self.num_blocks is not None:
            a += ["--num-gpu-blocks-override", str(self.num_blocks)]
        if self.eager:
            a += ["--enforce-eager"]
        if self.dtype is not None:
            a += ["--dtype", self.dtype]
        if self.max_num_seqs is not None:
            a += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.device == "cuda":
            a += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        return a


@dataclass
class Reply:
    """What one streamed ``/v1/completions`` call saw."""

    request_id: str
    status: int
    ttft_ms: float | None = None
    total_ms: float = 0.0
    tokens: list[int] = field(default_factory=list)
    error: str | None = None


class VllmServer:
    """One running vLLM server (use :func:`launch_vllm`)."""

    def __init__(self, config: VllmServerConfig, work: Path, files: HookFiles, port: int) -> None:
        self.config, self.work, self.files, self.port = config, work, files, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = work / "server.log"
        self.dump_dir = work / "kv_dump"
        self.gateway = Gateway(CONTEXT_SECRET)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SEMGOV_", "VLLM_"))}
        env["PYTHONPATH"] = str(ROOT)
        env.update(self.files.env())
        env.update(
            {
                "SEMGOV_PROVIDER": "tests.sglang_server.cpu_plugin:permissive_minhash",
                "SEMGOV_DETOKENIZER": "none",
                "SEMGOV_MIN_UNMATCHED_TOKENS": "256",
                "SEMGOV_DECISION_TIMEOUT_MS": "30000",
                "SEMGOV_AUDIT_WAIT_MS": "10000",
                "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache, to take vLLM's own prefix away
                # semgov:* (written by the engine core process) on /metrics beside vllm:*
                "PROMETHEUS_MULTIPROC_DIR": str(self.work / "prometheus"),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
            }
        )
        if self.config.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = self.config.kv_cache_gib
        if self.config.kv_dump:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            env["SEMGOV_VLLM_KV_DUMP"] = str(self.dump_dir)
        env.update(self.config.hook_env)
        return env

    def start(self, python: Path) -> None:
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", *self.config.args(self.port)]
        (self.work / "prometheus").mkdir(parents=True, exist_ok=True)
        (self.work / "command.txt").write_text(" ".join(cmd) + "\n")
        t0 = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.work),
                start_new_session=True,
            )
        while True:
            if self.proc.poll() is not None:
                raise RigError(f"vLLM exited during start-up (rc {self.proc.returncode}):\n{self.tail()}")
            try:
                if urllib.request.urlopen(self.url + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > self.config.startup_timeout_s:
                self.stop()
                raise RigError(f"vLLM not ready in {self.config.startup_timeout_s:.0f} s:\n{self.tail()}")
            time.sleep(2)
        self.started_s = time.monotonic() - t0

    def stop(self) -> None:
        """Stop the API server, engine core and workers (their process group)."""
        stop_group(self.proc, term_wait_s=60.0)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"

    def fatal_lines(self) -> list[str]:
        """Error lines before shutdown: an engine or connector failure, whatever the requests saw."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        text = text.split("[shutdown]", 1)[0]
        # NOTE: vLLM logs its own 400s (request validation, and a route handler's refusal) with a
        # traceback at ERROR: not a failure of the engine or of semgov.
        return [
            ln for ln in text.splitlines()
            if any(f in ln for f in FATAL) and "WARNING" not in ln
            and "[validation.py" not in ln and "[api_router.py" not in ln
        ]  # fmt: skip

    # ---- HTTP -------------------------------------------------------------------------------

    def token(self, tenant: str, namespace: str, segments: Any = None) -> str:
        return self.gateway.token(tenant, namespace, segments)

    def complete(
        self,
        prompt: list[int],
        request_id: str,
        token: str | None = None,
        *,
        max_tokens: int = 1,
        timeout: float = 300.0,
        abort_after_first: bool = False,
        cache_salt: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Reply:
        """A streamed completion of token ids; TTFT is the first chunk carrying a token. With
        ``abort_after_first`` the connection is closed at the first token (vLLM aborts the request)."""
        doc: dict[str, Any] = {"model": str(self.config.model), "prompt": prompt, "max_tokens": max_tokens,
                               "stream": True, "return_token_ids": True, "temperature": 0.0}  # fmt: skip
        if token is not None:
            doc["kv_transfer_params"] = {"semgov_context": token}
        if cache_salt is not None:
            doc["cache_salt"] = cache_salt
        doc.update(extra or {})  # other fields (prompt_logprobs needs "stream": False: then no TTFT)
        req = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(doc).encode(),
            headers={"content-type": "application/json", "X-Request-Id": request_id},
        )
        t0 = time.perf_counter()
        out = Reply(request_id, 0)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                out.status = r.status
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    for c in chunk.get("choices", []):
                        ids = c.get("token_ids") or []
                        if ids and out.ttft_ms is None:
                            out.ttft_ms = (time.perf_counter() - t0) * 1000
                        out.tokens += ids
                    if abort_after_first and out.tokens:
                        break
        except urllib.error.HTTPError as e:
            out.status, out.error = e.code, e.read().decode(errors="replace")[:500]
        except OSError as e:
            out.error = str(e)
        out.total_ms = (time.perf_counter() - t0) * 1000
        return out

    def post(self, path: str) -> int:
        req = urllib.request.Request(self.url + path, data=b"", method="POST")
        try:
            return int(urllib.request.urlopen(req, timeout=60).status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    def reset_prefix_cache(self) -> None:
        """Take vLLM's own prefix cache away (the connector's store stays)."""
        if self.post("/reset_prefix_cache") != 200:
            raise RigError("POST /reset_prefix_cache failed")

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples without labels summed by name (``vllm:*`` and ``semgov:*``)."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[-1])
            except ValueError:
                continue
        return out

    def audit(self, wait_s: float = 30.0) -> AuditSummary:
        return summarize(read_audit(self.files.audit_dir, wait_s))


@contextmanager
def launch_vllm(config: VllmServerConfig, work: Path, python: Path) -> Iterator[VllmServer]:
    """A started vLLM server; stopped (by process group) on exit, whatever happened."""
    server = VllmServer(config, work, HookFiles.make(work / "hook"), free_port())
    try:
        server.start(python)
        yield server
    finally:
        server.stop()


def by_client_id(summary: AuditSummary, client_id: str) -> str | None:
    """The audit label of the request the client sent as ``client_id`` (vLLM adds a prefix and suffix)."""
    labels = {*summary.decisions, *summary.realized, *(str(r.get("request_id")) for r in summary.failed)}
    hits = [lab for lab in labels if f"-{client_id}-" in f"{lab}-"]
    return hits[0] if len(hits) == 1 else None
