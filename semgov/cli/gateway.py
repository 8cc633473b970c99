"""``semgov gateway``: the OpenAI-compatible gateway in front of the governed engines.

``serve`` runs it; ``key`` makes an API key and the tenants-file entry that holds its hash
(``--calibrate``: the key may send calibration requests); ``context-key`` writes a new context key
file; ``check`` checks a tenants file and names the keys that may calibrate. docs/gateway.md
is the worked deployment.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semgov.errors import InputError

if TYPE_CHECKING:
    from semgov.gateway.upstream import UpstreamApi

_SERVE = """\
Clients send OpenAI chat or completions requests with `Authorization: Bearer <API key>`. The
gateway finds the key's tenant in the tenants file, checks what the request claims (`semgov`:
namespace, task, response_contract; segment marks) against what the key allows (403 if not),
renders the chat template with the model's tokenizer, mints a signed context token (tenant,
namespace, task, contract, segments, aud, exp, kid) and sends token ids and token to the engine's
/v1/completions: SGLang with the semgov hook (--engine sglang) or vLLM with semgov's middleware
and connector (--engine vllm), or a router in front of either. POST /v1/semgov/calibrate takes
`semgov calibrate --server` requests from keys whose entry says `calibrate: true` (SGLang only:
501 with --engine vllm) and sends them to SGLang's /generate. The tenants file and context key
are reloaded when they change (stable across two polls) and on SIGHUP. Metrics: GET /metrics.
Logs: one JSON line per request on stderr, never a key, token or prompt."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gateway",
        help="run the OpenAI-compatible gateway that signs each request's context",
        description="The gateway between a team's clients and the governed engines (docs/gateway.md).",
    )
    ps = p.add_subparsers(dest="gateway_command", metavar="ACTION", required=True)
    _serve_parser(ps)
    _key_parser(ps)
    c = ps.add_parser("context-key", help="write a new context key file (mode 0600)",
                      description="Write 32 random bytes, base64url, to FILE: the gateway's --context-key "
                      "and the engines' SEMGOV_CONTEXT_KEY.")  # fmt: skip
    c.add_argument("out", type=Path, metavar="FILE")
    c.set_defaults(func=run_context_key)
    t = ps.add_parser(
        "check",
        help="check a tenants file",
        description="Exit 0 if FILE loads (and say which keys may send calibration requests), 2 with "
        "file:line: problem if not.",
    )
    t.add_argument("tenants", type=Path, metavar="FILE")
    t.set_defaults(func=run_check)


# (flag, argparse keywords) of `serve`, in --help order.
_SERVE_ARGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--tenants", {"required": True, "type": Path, "metavar": "FILE",
                   "help": "the tenants file (API key hashes and what each key may claim)"}),
    ("--context-key", {"required": True, "type": Path, "metavar": "FILE",
                       "help": "the context key the engines' SEMGOV_CONTEXT_KEY holds (at least 32 bytes)"}),
    ("--audience", {"required": True, "metavar": "NAME",
                    "help": "the engines' SEMGOV_CONTEXT_AUDIENCE (tokens name it as aud)"}),
    ("--engine", {"required": True, "choices": ("sglang", "vllm"),
                  "help": "where the engine reads the token: SGLang's extra_key or vLLM's "
                  "kv_transfer_params"}),
    ("--upstream", {"required": True, "metavar": "URL",
                    "help": "the engine's (or router's) base URL, e.g. http://127.0.0.1:30000"}),
    ("--model", {"required": True, "metavar": "NAME",
                 "help": "the model name the engine serves; the only one clients may name"}),
    ("--tokenizer", {"required": True, "type": Path, "metavar": "DIR",
                     "help": "the model's directory with its tokenizer and chat template (read locally, "
                     "never downloaded)"}),
    ("--upstream-api", {"choices": ("completions", "generate"), "default": "completions",
                        "help": "the engine's /v1/completions (default), or SGLang's /generate with "
                        "input_ids: the body a router (smg, sglang-router) carries intact (--engine sglang "
                        "only)"}),
    ("--routing-key-header", {"metavar": "NAME",
                              "help": "send the scope routing key (an HMAC of tenant, namespace and the "
                              "evidence's hash) in this header, for the router to hash on, e.g. "
                              "x-smg-routing-key (docs/fleet.md)"}),
    ("--host", {"default": "127.0.0.1", "help": "listen address (default 127.0.0.1)"}),
    ("--port", {"type": int, "default": 8080, "help": "listen port (default 8080)"}),
    ("--token-lifetime-s", {"type": int, "default": 60,
                            "help": "how long a minted token stays valid (default 60; at most the engines' "
                            "SEMGOV_CONTEXT_MAX_LIFETIME_S)"}),
    ("--timeout-s", {"type": float, "default": 600.0,
                     "help": "the longest the engine may stay silent: the whole answer, or between stream "
                     "events (default 600)"}),
    ("--connect-timeout-s", {"type": float, "default": 5.0, "help": "connecting to the engine (default 5)"}),
    ("--max-body-mb", {"type": float, "default": 8.0,
                       "help": "largest request body accepted (default 8; 413 past it)"}),
    ("--reload-poll-s", {"type": float, "default": 1.0,
                         "help": "how often the tenants file and key are looked at (default 1)"}),
    ("--log", {"choices": ("json", "text"), "default": "json",
               "help": "request log format on stderr (default json)"}),
    ("--capture-dir", {"type": Path, "metavar": "DIR",
                       "help": "capture answered requests here as semgov.captured_request/v1 lines for "
                       "`semgov check` and `semgov diff` (needs --capture-rate, --capture-provenance-key, "
                       "--capture-policy-version)"}),
    ("--capture-rate", {"type": float, "metavar": "SHARE", "help": "share of answered requests "
                                                                   "captured, in (0, 1]"}),
    ("--capture-text", {"action": "store_true",
                        "help": "also capture the prompt text (off: token ids only; both are personal "
                                "data)"}),
    ("--capture-provenance-key", {"type": Path, "metavar": "PEM",
                                  "help": "Ed25519 key that signs each captured request's provenance as "
                                          "a donor"}),
    ("--capture-keyring", {"type": Path, "metavar": "FILE",
                           "help": "the keyring replays verify provenance with: names the key by its id "
                                   "there"}),
    ("--capture-policy-version", {"metavar": "VERSION",
                                  "help": "the policy the engines run, as NAME@VERSION (e.g. default@1; "
                                  "provenance names it)"}),
    ("--capture-candidates", {"type": int, "default": 8,
                              "help": "candidates per captured request: the last N captured, any tenant "
                                      "(default 8)"}),
    ("--capture-max-mb", {"type": int, "default": 64, "help": "rotate a capture file past this size "
                                                              "(default 64)"}),
    ("--capture-max-total-mb", {"type": int, "default": 1024,
                                "help": "the capture directory stays under this size (default 1024)"}),
    ("--capture-max-age-h", {"type": int, "default": 168, "help": "capture files older than this are "
                                                                  "deleted (default 168)"}),
)  # fmt: skip


def _serve_parser(ps: Any) -> None:
    s = ps.add_parser("serve", help="run the gateway", description=_SERVE,
                      formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    for flag, kwargs in _SERVE_ARGS:
        s.add_argument(flag, **kwargs)
    s.set_defaults(func=run_serve)


def _key_parser(ps: Any) -> None:
    k = ps.add_parser("key", help="make an API key and its tenants-file entry",
                      description="Print a new API key (give it to the client; it is never stored) and, on "
                      "stderr, "
                      "the tenants-file entry holding its hash.")  # fmt: skip
    k.add_argument("--id", required=True, help="a name for the key (logs and metrics show it)")
    k.add_argument("--tenant", required=True, help="the tenant every request with this key belongs to")
    k.add_argument(
        "--namespace",
        action="append",
        required=True,
        metavar="PATTERN",
        help="a namespace the key may claim (`*` matches any run of characters); repeatable",
    )
    k.add_argument(
        "--task",
        action="append",
        required=True,
        metavar="ID@VERSION",
        help="a task the key may claim (version `*`: any); repeatable",
    )
    k.add_argument(
        "--contract",
        action="append",
        required=True,
        metavar="ID@SHA256",
        help="a response contract the key may claim; repeatable",
    )
    k.add_argument(
        "--calibrate",
        action="store_true",
        help="the key may also send calibration requests (POST /v1/semgov/calibrate, for `semgov calibrate "
        "--server`): writes `calibrate: true`",
    )
    k.set_defaults(func=run_key)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from semgov import log
    from semgov.gateway import Gateway, GatewayConfig, Target

    log.configure(args.log, quiet=bool(getattr(args, "quiet", False)))
    if not 0 < args.token_lifetime_s <= 86400:
        raise InputError("--token-lifetime-s must be between 1 and 86400")
    config = GatewayConfig(
        tenants=args.tenants, context_key=args.context_key, audience=args.audience,
        target=Target(
            args.engine, args.upstream.rstrip("/"), args.model, args.timeout_s, args.connect_timeout_s,
            _upstream_api(args), _routing_header(args.routing_key_header),
        ),
        tokenizer=args.tokenizer, token_lifetime_s=args.token_lifetime_s,
        max_body_bytes=int(args.max_body_mb * (1 << 20)), reload_poll_s=args.reload_poll_s,
    )  # fmt: skip
    config = replace(config, capture=_capture_config(args))
    if not args.tokenizer.is_dir():
        raise InputError(
            "not a directory (the model's tokenizer files and chat template)", source=str(args.tokenizer)
        )
    gateway = Gateway(config)
    log.get_logger().info(
        "gateway starting", host=args.host, port=args.port, engine=args.engine,
        upstream=config.target.base_url,
        model=args.model, keys=len(gateway.reloader.tenants.by_hash),
    )  # fmt: skip
    # NOTE: everything loaded so far (tokenizer, tenants, modules) lives as long as the process:
    # frozen, the collector no longer walks it on every full collection (a p99 cost otherwise).
    gc.freeze()
    uvicorn.run(
        gateway.app(), host=args.host, port=args.port, log_level="warning", access_log=False, lifespan="on"
    )
    return 0


def _upstream_api(args: argparse.Namespace) -> UpstreamApi:
    if args.upstream_api == "generate":
        if args.engine != "sglang":
            raise InputError("--upstream-api generate is SGLang's /generate: it needs --engine sglang")
        return "generate"
    return "completions"


_HEADERS_SET = frozenset({"content-type", "content-length", "x-request-id", "host", "authorization"})


def _routing_header(name: str | None) -> str | None:
    """The routing-key header's name, lower case (raises :class:`InputError` for one that is not a
    header name, or one the gateway sets itself)."""
    if name is None:
        return None
    low = name.strip().lower()
    if not (0 < len(low) <= 64 and all(c.isascii() and (c.isalnum() or c in "-_") for c in low)):
        raise InputError(f"--routing-key-header {name!r} is not a header name (letters, digits, - and _)")
    if low in _HEADERS_SET:
        raise InputError(f"--routing-key-header {name!r} is a header the gateway sets itself")
    return low


def _capture_config(args: argparse.Namespace) -> Any:
    from semgov.gateway.capture import CaptureConfig

    if args.capture_dir is None:
        return None
    for flag in ("capture_rate", "capture_provenance_key", "capture_policy_version"):
        if getattr(args, flag) is None:
            raise InputError(f"--capture-dir needs --{flag.replace('_', '-')}")
    if "@" not in args.capture_policy_version:
        got = args.capture_policy_version
        raise InputError(f"--capture-policy-version must be NAME@VERSION (e.g. default@1), got {got!r}")
    if not 0.0 < args.capture_rate <= 1.0:
        raise InputError(f"--capture-rate must be in (0, 1], got {args.capture_rate}")
    return CaptureConfig(
        directory=args.capture_dir, rate=args.capture_rate, provenance_key=args.capture_provenance_key,
        policy_version=args.capture_policy_version, keyring=args.capture_keyring, keep_text=args.capture_text,
        candidates=args.capture_candidates, max_mb=args.capture_max_mb,
        max_total_mb=args.capture_max_total_mb, max_age_h=args.capture_max_age_h,
    )  # fmt: skip


def _pair(text: str, what: str) -> tuple[str, str]:
    a, sep, b = text.rpartition("@")
    if not sep or not a or not b:
        raise InputError(f"{what} must be written ID@{'VERSION' if what == '--task' else 'SHA256'}: {text!r}")
    return a, b


def run_key(args: argparse.Namespace) -> int:
    import json

    from semgov.gateway.tenants import hash_api_key, new_api_key

    api_key = new_api_key()
    entry = {
        "id": args.id, "sha256": hash_api_key(api_key), "tenant": args.tenant, "namespaces": args.namespace,
        "tasks": [dict(zip(("id", "version"), _pair(t, "--task"), strict=True)) for t in args.task],
        "response_contracts": [
            dict(zip(("id", "schema_sha256"), _pair(c, "--contract"), strict=True)) for c in args.contract
        ],
    }  # fmt: skip
    if args.calibrate:
        entry["calibrate"] = True
    print(api_key)
    print("# add to the tenants file's `keys:` list:\n  - " + json.dumps(entry), file=sys.stderr)
    return 0


def run_context_key(args: argparse.Namespace) -> int:
    import base64
    import secrets

    raw = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=")
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise InputError(
            f"cannot create ({e.strerror}; an existing key is never overwritten)", source=str(args.out)
        ) from e
    with os.fdopen(fd, "wb") as f:
        f.write(raw + b"\n")
    print(f"wrote {args.out}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    from semgov.gateway.tenants import load_tenants

    t = load_tenants(args.tenants)
    print(f"{args.tenants}: OK ({len(t.by_hash)} keys, {len(t.tenants)} tenants)")
    print(_calibrating(sorted(k.id for k in t.by_hash.values() if k.calibrate)))
    return 0


_SHOWN_KEYS = 20


def _calibrating(ids: list[str]) -> str:
    """The line naming the keys whose entry says ``calibrate: true`` (at most 20, each printable)."""
    if not ids:
        return "may calibrate: no key (add `calibrate: true` to a key's entry)"
    shown = [i if i.isprintable() and i.isascii() else ascii(i) for i in ids[:_SHOWN_KEYS]]
    more = f" and {len(ids) - _SHOWN_KEYS} more" if len(ids) > _SHOWN_KEYS else ""
    return f"may calibrate ({len(ids)} keys): {', '.join(shown)}{more}"
