"""The real-server test rig: a real SGLang 0.5.23 server on CPU with the ``semgov`` backend.

What is real here: ``python -m sglang.launch_server`` with its HTTP server, tokenizer manager,
scheduler and detokenizer processes, SGLang's own scheduler loop (overlap or not), chunked
prefill, retraction, eviction, aborts and ``/flush_cache``; the semgov backend exactly as a user
installs it (the ``semgov`` entry point of this checkout's install). What the rig adds, all
test-only and never part of the product's plugin:

- a general plugin (``tests/sglang_server/cpu_plugin.py``), made visible to the server's
  processes through a generated ``*.dist-info`` on ``PYTHONPATH``: it makes SGLang's rotary
  embedding take its native path on CPU (the recipe in ``../shared/RECIPES.md``) and, when asked,
  dumps K/V of chosen requests so a test can compare what a realization copied with what a cold
  prefill writes;
- a gateway (:class:`Gateway`) that writes signed context tokens into ``extra_key``;
- SGLang's strict KV-pool checks (``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY=1``,
  ``SGLANG_CHECK_KV_PAGE_INVARIANTS=1``, ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1``) and
  ``SEMGOV_STRICT=1``: a pool or lock accounting error kills the scheduler, and the rig sees it.

The server runs in a process group of its own and is stopped by that group. Nothing here
imports SGLang: the rig is a client, usable from pytest, ``server_check.sh`` and benchmarks.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ROOT / "engine_hooks" / "sglang" / "tiny_model"
SMOLLM2_ARCH = ROOT / "tests" / "sglang_server" / "smollm2_arch"
# The tiny Llama with llama3-scaled RoPE (factor 8 past 1,024 positions): scaled re-rotation.
TINY_LLAMA3_ROPE = ROOT / "tests" / "sglang_server" / "tiny_llama3_rope"
# A one-layer tiny Llama: layer 0's K/V of a token depend on the token and its position only, so a
# re-rotated shifted span is exactly (to float rounding) what a cold prefill computes: the canary
# test's healthy scope then matches cold, and only a degraded realization regresses.
TINY_1LAYER = ROOT / "tests" / "sglang_server" / "tiny_1layer"
CANARY_DEGRADED_TASK = "degraded-task"
RIG_POLICY = ROOT / "tests" / "sglang_server" / "policy"
STUBS = ROOT / "tests" / "sglang_hook" / "stubs"
PLUGIN_MODULE = "tests.sglang_server.cpu_plugin"
CONTEXT_SECRET = b"semgov-real-server-rig-gateway-key-0123456789"
AUDIENCE = "semgov-test"  # SEMGOV_CONTEXT_AUDIENCE of every rig server, the aud of its tokens
# Every rig server is in a context-key rotation's grace period: SEMGOV_CONTEXT_KEY_PREVIOUS names this.
PREVIOUS_CONTEXT_SECRET = b"the-gateway-key-before-the-rotation-0123456789"

TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}

# Lines of the server log that mean the run failed, whatever the requests saw.
FATAL_LOG = re.compile(
    r"Mem Leak Detected|memory leak detected|KV page use-after-free|KV double free|"
    r"semgov invariant violation|InvariantViolation|Scheduler hit an exception|"
    r"Traceback \(most recent call last\)"
)


def stop_group(proc: subprocess.Popen[bytes] | None, term_wait_s: float = 30.0) -> int | None:
    """Stop a server started in a process group of its own: TERM the group, wait up to
    ``term_wait_s``, then KILL whatever is left (schedulers, workers); the leader's exit status."""
    if proc is None:
        return None
    pgid = proc.pid
    if proc.poll() is None:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=term_wait_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)  # whatever is left: scheduler, detokenizer, workers
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    return proc.returncode


class RigError(RuntimeError):
    """The rig could not start, drive or read the server (the message says what and where)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerConfig:
    """How one server is launched (SGLang flags the scenarios vary, and the hook's settings)."""

    model: Path = TINY_MODEL
    dummy_weights: bool = True  # config-only model dir: --load-format dummy --skip-tokenizer-init
    device: str = "cpu"
    dtype: str = "float32"
    page_size: int = 1
    max_total_tokens: int = 131072
    chunked_prefill_size: int | None = None
    overlap: bool = True
    max_running_requests: int | None = None
    extra_args: tuple[str, ...] = ()
    hook_env: dict[str, str] = field(default_factory=dict)
    kv_dump: bool = False
    strict: bool = True
    startup_timeout_s: float = 420.0
    backend: str | None = "semgov"  # --radix-cache-backend; None: SGLang's stock radix cache
    launcher: tuple[str, ...] = ()  # a command the server runs under, e.g. ("taskset", "-c", "1")

    def args(self, port: int) -> list[str]:
        a = [
            "--model-path", str(self.model),
            "--device", self.device,
            "--dtype", self.dtype,
            *(("--radix-cache-backend", self.backend) if self.backend else ()),
            "--page-size", str(self.page_size),
            "--max-total-tokens", str(self.max_total_tokens),
            "--random-seed", "0",
            "--host", "127.0.0.1",
            "--port", str(port),
            "--log-level", "info",
        ]  # fmt: skip
        if self.device == "cpu":
            a += ["--attention-backend", "torch_native", "--disable-cuda-graph", "--sleep-on-idle"]
        if self.dummy_weights:
            a += ["--load-format", "dummy", "--skip-tokenizer-init"]
        if self.chunked_prefill_size is not None:
            a += ["--chunked-prefill-size", str(self.chunked_prefill_size)]
        if not self.overlap:
            a += ["--disable-overlap-schedule"]
        if self.max_running_requests is not None:
            a += ["--max-running-requests", str(self.max_running_requests)]
        return a + list(self.extra_args)


def server_configs(device: str = "cpu") -> dict[str, ServerConfig]:
    """The servers the tests and the server check run (chunked prefill below the prompt length in
    all): overlap scheduling with page size 1 (and the rig's KV dump; also with a llama3-scaled
    RoPE model), no overlap with page size 16, SGLang's retraction test mode, and a pool too small
    for its traffic."""
    base = ServerConfig(device=device, dtype="float32" if device == "cpu" else "bfloat16")
    return {
        "page1-overlap": replace(base, page_size=1, overlap=True, chunked_prefill_size=1024, kv_dump=True),
        "llama3-rope": replace(
            base, model=TINY_LLAMA3_ROPE, page_size=1, overlap=True, chunked_prefill_size=1024, kv_dump=True
        ),
        "page16-no-overlap": replace(base, page_size=16, overlap=False, chunked_prefill_size=1024),
        "retract": replace(
            base,
            page_size=1,
            chunked_prefill_size=512,
            hook_env={"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "3"},
        ),
        # NOTE: SGLang's CPU path runs two TP ranks on a one-NUMA-node machine only with one OMP
        # thread per rank, each bound to its own core.
        "tp2": replace(
            base,
            page_size=1,
            overlap=True,
            chunked_prefill_size=1024,
            kv_dump=True,
            extra_args=("--tp-size", "2"),
            hook_env={"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "OMP_NUM_THREADS": "1"},
        ),
        "tp2-diverge": replace(
            base,
            page_size=1,
            chunked_prefill_size=1024,
            strict=False,
            extra_args=("--tp-size", "2"),
            hook_env={
                "SGLANG_CPU_OMP_THREADS_BIND": "0|1",
                "OMP_NUM_THREADS": "1",
                "SEMGOV_RIG_TP_FOLLOWER_FORGETS": "1",
            },
        ),
        "canary": replace(
            base,
            model=TINY_1LAYER,
            page_size=1,
            overlap=True,
            chunked_prefill_size=1024,
            hook_env={
                "SEMGOV_CANARY_RATE": "1",
                "SEMGOV_CANARY_TOKENS": "8",
                "SEMGOV_CANARY_BUDGET": "0",
                "SEMGOV_CANARY_IDLE_MS": "100",
                "SEMGOV_RIG_DEGRADE_TASK": CANARY_DEGRADED_TASK,
            },
        ),
        "pressure": replace(
            base,
            page_size=16,
            chunked_prefill_size=1024,
            max_total_tokens=8192,
            extra_args=("--schedule-conservativeness", "0.05"),
        ),
    }


@dataclass
class HookFiles:
    """Keys, keyring, gateway key, policy and audit directory of one server (all on disk)."""

    dir: Path
    signing_key: Path
    public_key: Path
    trust: Path
    context_key: Path
    audit_dir: Path
    policy: Path

    @classmethod
    def make(cls, directory: Path, policy: Path = RIG_POLICY) -> HookFiles:
        from semgov.signing.keys import generate_keypair, key_id_for, load_public_key

        directory.mkdir(parents=True, exist_ok=True)
        priv, pub = generate_keypair(directory / "keys")
        trust = directory / "keyring.json"
        kid = key_id_for(load_public_key(pub))
        trust.write_text(json.dumps({"keys": [{"key_id": kid, "public_key": pub.read_text()}]}))
        ck = directory / "context.key"
        ck.write_bytes(CONTEXT_SECRET)
        (directory / "context-previous.key").write_bytes(PREVIOUS_CONTEXT_SECRET)
        return cls(directory, priv, pub, trust, ck, directory / "audit", policy)

    def env(self) -> dict[str, str]:
        return {
            "SEMGOV_POLICY": str(self.policy),
            "SEMGOV_TRUST": str(self.trust),
            "SEMGOV_SIGNING_KEY": str(self.signing_key),
            "SEMGOV_CONTEXT_KEY": str(self.context_key),
            "SEMGOV_CONTEXT_AUDIENCE": AUDIENCE,
            "SEMGOV_CONTEXT_KEY_PREVIOUS": str(self.dir / "context-previous.key"),
            "SEMGOV_AUDIT_DIR": str(self.audit_dir),
        }


def write_test_plugin(directory: Path) -> Path:
    """A ``*.dist-info`` declaring the rig's general plugin; put ``directory`` on ``PYTHONPATH``."""
    info = directory / "semgov_rig_cpu_plugin-0.1.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: semgov-rig-cpu-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[sglang.srt.plugins]\nsemgov_rig = {PLUGIN_MODULE}:register\n")
    return directory


@dataclass
class Result:
    """What one ``/generate`` call saw (streamed: TTFT is the first chunk with output)."""

    rid: str
    ok: bool
    ttft_ms: float | None = None
    total_ms: float | None = None
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int | None = None
    cached_host: int | None = None
    cached_device: int | None = None
    finish_reason: Any = None
    error: str | None = None
    status: int | None = None
    chunk_s: list[float] = field(default_factory=list)  # perf_counter() of every chunk with new output


class Server:
    """One running SGLang server (use :func:`launch`)."""

    def __init__(self, config: ServerConfig, work: Path, files: HookFiles, port: int) -> None:
        self.config = config
        self.work = work
        self.files = files
        self.port = port
        self.host = "127.0.0.1"
        self.log_path = work / "server.log"
        self.kv_dump_dir = work / "kv_dump"
        self.donor_log = work / "donors.log"
        self.sched_log = work / "sched_ns.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None
        self.gateway = Gateway(CONTEXT_SECRET)

    # ---- process ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        plugin_dir = write_test_plugin(self.work / "plugin")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SEMGOV_", "SGLANG_"))}
        paths = [str(plugin_dir), str(ROOT)]
        if not _has_torchvision():
            paths.append(str(STUBS))
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env.update(self.files.env())
        env.update(
            {
                "SEMGOV_PROVIDER": f"{PLUGIN_MODULE}:permissive_minhash",
                "SEMGOV_DETOKENIZER": "none",
                "SEMGOV_MIN_UNMATCHED_TOKENS": "256",
                "SEMGOV_STRICT": "1" if self.config.strict else "0",
                "SEMGOV_ASYNC_REGISTRATION": "1",
                # Generous deadlines: a loaded 2-core CI machine must not turn an allow into a timeout
                # deny or a cold run (the defaults are measured in benchmarks, not asserted here).
                "SEMGOV_DECISION_TIMEOUT_MS": "30000",
                "SEMGOV_AUDIT_WAIT_MS": "10000",
                # SGLang's own KV-pool accounting, asserted after every batch and when idle.
                "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY": "1",
                "SGLANG_CHECK_KV_PAGE_INVARIANTS": "1",
                "SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE": "1",
                "SEMGOV_RIG_DEVICE": self.config.device,
                "SEMGOV_RIG_DONOR_LOG": str(self.donor_log),
                "SEMGOV_RIG_SCHED_LOG": str(self.sched_log),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        )
        if self.config.kv_dump:
            self.kv_dump_dir.mkdir(parents=True, exist_ok=True)
            env["SEMGOV_RIG_KV_DUMP"] = str(self.kv_dump_dir)
        env.update(self.config.hook_env)
        return env

    def start(self) -> None:
        launch_server = [sys.executable, "-m", "sglang.launch_server"]
        cmd = [*self.config.launcher, *launch_server, *self.config.args(self.port)]
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "command.txt").write_text(" ".join(cmd) + "\n")
        log = self.log_path.open("wb")
        t0 = time.monotonic()
        # NOTE: a process group of its own: stop() ends the launcher, scheduler and detokenizer.
        self.proc = subprocess.Popen(
            cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True
        )
        log.close()
        deadline = t0 + self.config.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RigError(
                    f"the server exited during start-up (rc {self.proc.returncode}):\n{self.tail()}"
                )
            if self.healthy(timeout=5.0):
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RigError(f"no /health after {self.config.startup_timeout_s:.0f}s:\n{self.tail()}")
            time.sleep(1.0)
        self.started_s = time.monotonic() - t0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> int | None:
        """Stop the whole process group (TERM, then KILL); returns the launcher's exit status."""
        return stop_group(self.proc)

    def tail(self, n: int = 60) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no server log)"
        return "\n".join(lines[-n:])

    def fatal_lines(self) -> list[str]:
        """Lines of the server log that mean a crash, a leak or an invariant violation."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if FATAL_LOG.search(ln)]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    # ---- HTTP -------------------------------------------------------------------------------

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
        c = self._conn(timeout)
        try:
            c.request("GET", path)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def post(self, path: str, payload: Any, timeout: float = 60.0) -> tuple[int, bytes]:
        c = self._conn(timeout)
        try:
            c.request("POST", path, body=json.dumps(payload), headers={"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    def healthy(self, timeout: float = 30.0) -> bool:
        """``GET /health`` answers 200 (when idle it runs a one-token generation)."""
        try:
            return self.get("/health", timeout)[0] == 200
        except (OSError, http.client.HTTPException):
            return False

    def server_info(self) -> dict[str, Any]:
        status, body = self.get("/server_info")
        if status != 200:
            raise RigError(f"GET /server_info: HTTP {status}")
        return dict(json.loads(body))

    def flush_cache(self) -> int:
        return self.post("/flush_cache", {})[0]

    def generate(
        self,
        input_ids: Sequence[int],
        *,
        rid: str | None = None,
        extra_key: str | None = None,
        max_new_tokens: int = 4,
        timeout: float = 300.0,
        abort_after_chunks: int | None = None,
        ignore_eos: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> Result:
        """One streamed ``/generate`` with ``input_ids``; ``abort_after_chunks``: hang up after
        that many streamed chunks (0: right after the response headers), as a client that
        disconnects. ``ignore_eos`` (default) makes the length exact; SGLang then reserves the
        whole ``max_new_tokens`` at admission, so a request that may retract needs it off."""
        payload: dict[str, Any] = {
            "input_ids": list(input_ids),
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "temperature": 0.0,
                "ignore_eos": ignore_eos,
            },
            "stream": True,
        }
        if rid is not None:
            payload["rid"] = rid
        if extra_key is not None:
            payload["extra_key"] = extra_key
        if extra:
            payload.update(extra)
        return stream_generate(self.host, self.port, payload, timeout, abort_after_chunks)


def _has_torchvision() -> bool:
    """A real torchvision is installed (the import-only stub, which the harness tests may have put
    on this process's sys.path, does not count: the server's processes need it on PYTHONPATH)."""
    import importlib.util

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return False
    return not Path(spec.origin).resolve().is_relative_to(STUBS.resolve())


def stream_generate(
    host: str, port: int, payload: dict[str, Any], timeout: float, abort_after_chunks: int | None = None
) -> Result:
    """POST a streamed ``/generate``; TTFT = time to the first ``data:`` chunk with output ids."""
    rid = str(payload.get("rid", ""))
    res = Result(rid, ok=False)
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    try:
        c.request("POST", "/generate", body=json.dumps(payload), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        res.status = r.status
        if r.status != 200:
            res.error = f"HTTP {r.status}: {r.read()[:500]!r}"
            return res
        chunks = 0
        meta: dict[str, Any] = {}
        if abort_after_chunks == 0:
            res.error = "aborted by the client"
            return res
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                res.error = f"stream error: {chunk['error']}"
                return res
            chunks += 1
            ids = chunk.get("output_ids") or []
            now = time.perf_counter()
            if res.ttft_ms is None and ids:
                res.ttft_ms = (now - t0) * 1e3
            if len(ids) > len(res.output_ids):
                res.chunk_s.append(now)
            if len(ids) >= len(res.output_ids):
                res.output_ids = list(ids)
            meta = chunk.get("meta_info") or meta
            if abort_after_chunks is not None and chunks >= abort_after_chunks:
                res.error = "aborted by the client"
                return res
        res.total_ms = (time.perf_counter() - t0) * 1e3
        res.rid = str(meta.get("id", rid))
        res.cached_tokens = meta.get("cached_tokens")
        details = meta.get("cached_tokens_details") or {}
        res.cached_device, res.cached_host = details.get("device"), details.get("host")
        res.finish_reason = meta.get("finish_reason")
        if res.ttft_ms is None:
            res.error = "no output token streamed"
            return res
        res.ok = True
        return res
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    finally:
        c.close()  # NOTE: closing mid-stream is how a client disconnect reaches SGLang


class Gateway:
    """What a trusted gateway does: mint the signed context token a request carries in ``extra_key``."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret

    def token(
        self,
        tenant: str,
        namespace: str,
        segments: Sequence[tuple[str, int, int]] | None = None,
        *,
        task: dict[str, str] | None = None,
        contract: dict[str, str] | None = None,
        secret: bytes | None = None,
        audience: str = AUDIENCE,
        expires_at: int | None = None,
    ) -> str:
        """A token (by default under the current key, for the rig's audience, 300 s to live)."""
        from semgov.context import make_context_token

        return make_context_token(
            secret or self.secret,
            audience=audience,
            expires_at=expires_at,
            tenant=tenant,
            namespace=namespace,
            task=task or TASK,
            response_contract=contract or CONTRACT,
            segments=list(segments) if segments is not None else None,
        )


@contextmanager
def launch(config: ServerConfig, work: Path) -> Iterator[Server]:
    """A started server; stopped (by process group) on exit, whatever happened."""
    files = HookFiles.make(work / "hook")
    server = Server(config, work, files, free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()


# ---- the audit log ------------------------------------------------------------------------------


def read_audit(audit_dir: Path, wait_s: float = 30.0) -> list[dict[str, Any]]:
    """Every record, once the hook's writer has committed and checkpointed all it holds."""
    from semgov.audit.errors import AuditLogError
    from semgov.audit.reader import iter_records, read_checkpoint

    deadline = time.monotonic() + wait_s
    last = -1
    records: list[dict[str, Any]] = []
    while True:
        try:
            records = [json.loads(r) for _, r in iter_records(audit_dir)]
            note = read_checkpoint(audit_dir)
            size = int(note.decode().split("\n")[1]) if note else 0
            if len(records) == last and size == len(records):
                return records
            last = len(records)
        except (AuditLogError, FileNotFoundError, ValueError, IndexError):
            pass  # a writer mid-batch, or no log yet: read again
        if time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def verify_audit(files: HookFiles) -> str | None:
    """``semgov audit verify`` on the log with the hook's public key: None if it verifies, else why."""
    proc = subprocess.run(
        [sys.executable, "-m", "semgov.cli.main", "audit", "verify", str(files.audit_dir),
         "--pubkey", str(files.public_key)],
        capture_output=True, text=True, cwd=str(ROOT), timeout=600,
    )  # fmt: skip
    if proc.returncode == 0:
        return None
    return f"exit {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"


@dataclass
class AuditSummary:
    """The audit log by request label: decisions, realizations, failures and violations."""

    decisions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    realized: dict[str, int] = field(default_factory=dict)
    realizations: list[dict[str, Any]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)  # allows not acted on, fallbacks
    # NOTE: allows of a request for a donor other than the one realized (another_donor_chosen):
    # their outcome is known when the decision is taken, before the chosen one's realization.
    not_chosen: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    canaries: list[dict[str, Any]] = field(default_factory=list)  # canary and shifted_reuse_disabled
    reloads: list[dict[str, Any]] = field(default_factory=list)  # policy_loaded and policy_load_failed
    shadows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by request id
    counts: dict[str, int] = field(default_factory=dict)

    def allowed(self, rid: str) -> int:
        return sum(1 for d in self.decisions.get(rid, []) if d["decision"] == "allow")

    def denied(self, rid: str) -> int:
        return sum(1 for d in self.decisions.get(rid, []) if d["decision"] == "deny")


def summarize(records: list[dict[str, Any]]) -> AuditSummary:
    from semgov.wire.names import not_realized_reason

    s = AuditSummary()
    for r in records:
        schema = r.get("schema")
        if schema == "semgov.decision/v3":
            s.decisions.setdefault(str(r["request_id"]), []).append(r)
            key = f"decision:{r['decision']}"
        elif schema in ("semgov.engine_event/v1", "semgov.engine_event/v2"):
            kind = str(r["kind"])
            key = f"event:{kind}"
            if kind == "realization":
                rid = str(r["request_id"])
                s.realized[rid] = s.realized.get(rid, 0) + int(r["materialized_tokens"])
                s.realizations.append(r)
            elif kind == "realization_failed":
                other = not_realized_reason(r.get("detail")) == "another_donor_chosen"
                (s.not_chosen if other else s.failed).append(r)
            elif kind in ("invariant_violation", "reuse_disabled"):
                s.violations.append(r)
            elif kind in ("canary", "shifted_reuse_disabled"):
                s.canaries.append(r)
            elif kind in ("policy_loaded", "policy_load_failed"):
                s.reloads.append(r)
        elif schema == "semgov.shadow_decision/v1":
            s.shadows.setdefault(str(r["request_id"]), []).append(r)
            key = f"shadow:{r['decision']}"
        else:
            key = f"other:{schema}"
        s.counts[key] = s.counts.get(key, 0) + 1
    return s


# ---- prompts --------------------------------------------------------------------------------


def block(seed: str, n: int, lo: int = 100, hi: int = 49_000) -> list[int]:
    """``n`` deterministic token ids in the tiny vocabulary, clear of special ids."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(lo, hi) for _ in range(n)]


def layout(parts: Sequence[tuple[str, list[int]]]) -> tuple[list[int], list[tuple[str, int, int]]]:
    """Concatenated tokens and the tiling ``(role, start, end)`` segments of ``parts``."""
    tokens: list[int] = []
    segs: list[tuple[str, int, int]] = []
    for role, toks in parts:
        segs.append((role, len(tokens), len(tokens) + len(toks)))
        tokens += toks
    return tokens, segs


@dataclass
class PairPrompts:
    """A shifted-evidence pair: donor ``[S][I][E][Q1]``, recipient ``[S][E][Q2]`` (and the primer
    ``[S][Q1]`` that gives a cold arm the same exact prefix as the warm one)."""

    donor: list[int]
    donor_segs: list[tuple[str, int, int]]
    recipient: list[int]
    recipient_segs: list[tuple[str, int, int]]
    primer: list[int]
    primer_segs: list[tuple[str, int, int]]
    evidence_start: int  # where E starts in the recipient
    evidence_len: int


def pair_prompts(
    seed: str,
    s_len: int = 256,
    i_len: int = 64,
    e_len: int = 2048,
    q_len: int = 32,
    *,
    unrelated: bool = False,
    wrapper: int = 0,
) -> PairPrompts:
    """Donor ``[S][I][E][Q1]``; recipient ``[S][E][Q2]``, or with ``wrapper`` tokens of a new
    instruction ``[S][W][E][Q2]`` (E then lies after fresh tokens: a region past the front)."""
    system, instruction, evidence = (
        block(f"{seed}/S", s_len),
        block(f"{seed}/I", i_len),
        block(f"{seed}/E", e_len),
    )
    q1, q2 = block(f"{seed}/Q1", q_len), block(f"{seed}/Q2", q_len)
    donor, dsegs = layout(
        [("system", system), ("instruction", instruction), ("evidence", evidence), ("question", q1)]
    )
    if unrelated:
        evidence = block(f"{seed}/E-other", e_len)
    front = [("system", system)] + ([("instruction", block(f"{seed}/W", wrapper))] if wrapper else [])
    rcp, rsegs = layout([*front, ("evidence", evidence), ("question", q2)])
    primer, psegs = layout([("system", system), ("question", q1)])
    return PairPrompts(donor, dsegs, rcp, rsegs, primer, psegs, s_len + wrapper, e_len)


def settle(server: Server, timeout: float = 120.0) -> None:
    """Wait until the server is idle and the hook's registration thread has finished every donor
    queued so far (the rig's plugin logs both sides), so the next request can find them."""
    wait_idle(server)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        marks = server.donor_log.read_bytes() if server.donor_log.exists() else b""
        if marks.count(b"s") == marks.count(b"r"):
            return
        time.sleep(0.02)
    raise RigError(f"donor registrations still running after {timeout:.0f} s ({server.donor_log})")


def run_concurrently(jobs: Sequence[Any], workers: int) -> list[Any]:
    """Call every zero-argument job on its own thread (at most ``workers`` at once), in order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(lambda j: j(), jobs))


def loads(server: Server) -> list[dict[str, Any]]:
    """SGLang's per-scheduler load report (``GET /v1/loads``): running and waiting requests,
    ``num_used_tokens`` (KV slots not free, the tree's included), ``max_total_num_tokens``."""
    status, body = server.get("/v1/loads")
    if status != 200:
        raise RigError(f"GET /v1/loads: HTTP {status}")
    return list(json.loads(body)["loads"])


def wait_idle(server: Server, timeout: float = 60.0) -> bool:
    """Wait until no scheduler reports a running or waiting request; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(int(x["num_running_reqs"]) + int(x["num_waiting_reqs"]) == 0 for x in loads(server)):
                return True
        except (RigError, OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.5)
    return False
