"""The gateway's added latency per request: through ``semgov gateway`` beside a direct call to the
same engine, at 4,000-token chat prompts (issue 34; target: under 2 ms p99 on this machine class,
tokenization included).

Two arms, interleaved request by request over one keep-alive HTTP connection each:

- **direct**: the client sends the engine what the gateway would (the prompt's token ids, already
  tokenized, and a context token, already minted) to ``/v1/completions``;
- **gateway**: the client sends the chat messages with an API key to the real ``semgov gateway
  serve`` (a subprocess, uvicorn), which authenticates, checks the claims, renders the chat
  template, tokenizes, mints and forwards to the same engine.

The added latency is gateway minus direct, per pair (p50, p99, n). The engine is ``--engine stub``
by default: an aiohttp process that answers at once, so the difference is the gateway's alone (a
real engine's prefill of 4,000 tokens varies by far more than 2 ms between two calls). With
``--engine sglang URL --model NAME`` the same pairs run against a real server (then max_tokens 1).

It also times the gateway's own steps in-process on the same prompts (parse the body, render the
template, tokenize with offsets, compute segments, mint the token), to say what dominates, and
prints the machine baseline of the audit benchmarks (benchmarks/_machine.py).

    python benchmarks/gateway_latency.py                 # n=400 pairs, 4,000-token prompts
    python benchmarks/gateway_latency.py --smoke         # n=20, 500 tokens: seconds, for CI
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import baseline  # noqa: E402

AUDIENCE = "bench"
WORDS = "revenue margin quarter capital guidance segment churn backlog pipeline dividend".split()
STUB = """
import sys
from aiohttp import web
DOC = (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
       b'"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}')
async def completions(request):
    await request.read()
    return web.Response(body=DOC, content_type="application/json")
app = web.Application(client_max_size=64 << 20)
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


LOGGED = ("prepare_ms", "upstream_ms", "total_ms")


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "p50": round(pct(xs, 50), 3),
        "p99": round(pct(xs, 99), 3),
        "mean": round(statistics.fmean(xs), 3),
    }


def evidence_words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(WORDS)} {rng.randrange(10_000)}." for _ in range(n))


def words_for(tokens: int, tok: Any) -> int:
    """How many evidence words make a chat of about ``tokens`` ids (measured on seed 0)."""
    n = 25
    while len(tok.encode(evidence_words(0, n)).ids) < tokens - 60:
        n += 25
    return n


def messages(seed: int, n_words: int) -> list[dict[str, str]]:
    """System, evidence of ``n_words`` words, question."""
    return [
        {"role": "system", "content": "You are a careful analyst. Answer with one JSON object."},
        {"role": "user", "content": "Research file:\n" + evidence_words(seed, n_words)},
        {"role": "user", "content": f"What was the revenue in quarter {seed}?"},
    ]


def body(msgs: list[dict[str, str]]) -> dict[str, Any]:
    return {"messages": msgs, "max_tokens": 1, "semgov": {"namespace": "acme/bench",
            "segments": [{"message": 1, "role": "evidence"}]}}  # fmt: skip


STEPS = ("parse", "render", "tokenize_cold", "tokenize_warm", "find_and_segment", "mint", "prepare_cold",
         "prepare_warm")  # fmt: skip


def step_times(tok_dir: Path, bodies: list[dict[str, Any]], key: bytes) -> dict[str, list[float]]:
    """The gateway's own steps, in-process, per prompt (ms), on a tokenizer whose cache starts empty:
    ``tokenize_cold`` encodes the whole text, ``tokenize_warm`` the same text again (its pieces cached)."""
    from semgov.context import make_context_token
    from semgov.gateway.prompt import ModelTokenizer
    from semgov.gateway.request import parse_body

    tok = ModelTokenizer(tok_dir)
    out: dict[str, list[float]] = {k: [] for k in STEPS}
    for b in bodies:
        raw = json.dumps(b).encode()
        t0 = time.perf_counter()
        parsed = parse_body(raw, chat=True, max_prompt_chars=2_000_000)
        t1 = time.perf_counter()
        text = tok.render(parsed.messages)
        t2 = time.perf_counter()
        tok.encode(text)  # cold: every piece a miss
        t3 = time.perf_counter()
        tok.encode(text)  # warm
        t4 = time.perf_counter()
        prompt = tok.chat(parsed.messages, parsed.roles)  # render + warm tokenize + find + segments
        t5 = time.perf_counter()
        make_context_token(key, audience=AUDIENCE, tenant="acme", namespace="acme/bench",
                           task={"id": "qa", "version": "1"},
                           response_contract={"id": "c", "schema_sha256": "a" * 64},
                           segments=prompt.segments)  # fmt: skip
        t6 = time.perf_counter()
        ms = {"parse": t1 - t0, "render": t2 - t1, "tokenize_cold": t3 - t2, "tokenize_warm": t4 - t3,
              "find_and_segment": max(0.0, (t5 - t4) - (t2 - t1) - (t4 - t3)), "mint": t6 - t5}  # fmt: skip
        common = ms["parse"] + ms["render"] + ms["find_and_segment"] + ms["mint"]
        ms["prepare_cold"] = common + ms["tokenize_cold"]
        ms["prepare_warm"] = common + ms["tokenize_warm"]
        for k, v in ms.items():
            out[k].append(v * 1e3)
    return out


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited (rc {proc.returncode})")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not answer in 120 s")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from semgov.context import make_context_token
    from semgov.gateway.prompt import ModelTokenizer
    from tests.gateway.fixtures import KEYS, tenants_yaml, tokenizer_dir

    tok_dir = Path(args.tokenizer) if args.tokenizer else tokenizer_dir()
    tok = ModelTokenizer(tok_dir)
    work = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    (work / "tenants.yaml").write_text(tenants_yaml().replace("answer-json", "c"))
    key = b"b" * 32
    (work / "context.key").write_bytes(key)
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        if args.engine == "stub":
            port = free_port()
            procs.append(subprocess.Popen([sys.executable, "-c", STUB, str(port)], env=env))
            upstream, model = f"http://127.0.0.1:{port}", "m"
            wait_http(upstream + "/v1/completions", procs[-1], "the stub engine")
        else:
            upstream, model = args.upstream.rstrip("/"), args.model
        gport = free_port()
        cmd = [sys.executable, "-m", "semgov.cli.main", "gateway", "serve",
               "--tenants", str(work / "tenants.yaml"), "--context-key", str(work / "context.key"),
               "--audience", AUDIENCE, "--engine", "sglang", "--upstream", upstream, "--model", model,
               "--tokenizer", str(tok_dir), "--port", str(gport)]  # fmt: skip
        log = (work / "gateway.log").open("wb")
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=str(ROOT)))
        gateway = f"http://127.0.0.1:{gport}"
        wait_http(gateway + "/health", procs[-1], "the gateway")
        n_words = words_for(args.tokens, tok)
        distinct = args.n + args.warmup if args.cold else args.prompts
        bodies = [body(messages(i, n_words)) for i in range(distinct)]
        directs = []
        for b in bodies:
            p = tok.chat(b["messages"], ["system", "evidence", "question"])
            token = make_context_token(key, audience=AUDIENCE, tenant="acme", namespace="acme/bench",
                                       task={"id": "qa", "version": "1"},
                                       response_contract={"id": "c", "schema_sha256": "a" * 64},
                                       segments=p.segments, lifetime_s=3600)  # fmt: skip
            directs.append({"model": model, "prompt": p.ids, "max_tokens": 1, "extra_key": token})
        n_tokens = [len(d["prompt"]) for d in directs]
        headers = {"authorization": f"Bearer {KEYS['acme']}"}
        direct_ms, gateway_ms = [], []
        with httpx.Client(timeout=300) as dc, httpx.Client(timeout=300, headers=headers) as gc:
            for i in range(args.warmup + args.n):
                j = i % len(bodies)
                order = (0, 1) if i % 2 == 0 else (1, 0)
                t: list[float] = [0.0, 0.0]
                for arm in order:
                    t0 = time.perf_counter()
                    if arm == 0:
                        r = dc.post(upstream + "/v1/completions", json=directs[j])
                    else:
                        r = gc.post(gateway + "/v1/chat/completions", json=bodies[j])
                    t[arm] = (time.perf_counter() - t0) * 1e3
                    if r.status_code != 200:
                        raise SystemExit(f"arm {arm} answered {r.status_code}: {r.text[:300]}")
                if i >= args.warmup:
                    direct_ms.append(t[0])
                    gateway_ms.append(t[1])
        steps = step_times(tok_dir, [body(messages(10**6 + i, n_words)) for i in range(args.steps)], key)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=30)
    added = [g - d for g, d in zip(gateway_ms, direct_ms, strict=True)]
    logged = [
        json.loads(line) for line in (work / "gateway.log").read_text().splitlines() if line.startswith("{")
    ]
    served = [r for r in logged if r.get("event") == "gateway request" and r.get("status") == 200][
        args.warmup :
    ]
    return {
        "engine": args.engine, "n": args.n, "distinct_prompts": distinct,
        "prompt_tokens": {"min": min(n_tokens), "max": max(n_tokens)},
        "direct_ms": summary(direct_ms), "gateway_ms": summary(gateway_ms), "added_ms": summary(added),
        "steps_ms": {k: summary(v) for k, v in steps.items()},
        "gateway_log_ms": {k: summary([r[k] for r in served]) for k in LOGGED},
        "machine": baseline(work),
        "cpus": os.cpu_count(), "load_avg": os.getloadavg(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("stub", "sglang"), default="stub")
    p.add_argument("--upstream", help="with --engine sglang: the server's base URL")
    p.add_argument("--model", help="with --engine sglang: its served model name")
    p.add_argument(
        "--tokenizer", help="tokenizer directory (default: SmolLM2's, built from the registry GGUF)"
    )
    p.add_argument("--tokens", type=int, default=4000, help="prompt length in tokens (default 4000)")
    p.add_argument("--n", type=int, default=400, help="request pairs measured (default 400)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--prompts", type=int, default=20, help="distinct prompts, cycled (default 20)")
    p.add_argument(
        "--cold",
        action="store_true",
        help="every request a new prompt (the gateway's piece cache never hits)",
    )
    p.add_argument(
        "--steps", type=int, default=100, help="prompts the in-process step timing runs (default 100)"
    )
    p.add_argument("--smoke", action="store_true", help="n=20, 500-token prompts: a few seconds")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    if args.smoke:
        args.n, args.warmup, args.tokens, args.prompts, args.steps = 20, 4, 500, 4, 10
    if args.engine == "sglang" and not (args.upstream and args.model):
        p.error("--engine sglang needs --upstream and --model")
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
