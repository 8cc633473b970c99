"""The hostile campaign's target for the vLLM scope middleware's request bodies (issue 31).

Every body a client can send reaches :func:`engine_hooks.vllm.scope.scope_body` before vLLM routes
it, whatever the path. The documented outcomes are a body to pass on or :class:`Refused` with a 4xx
status; anything else is a crash. The oracle, written from the contract and not from the code:

- a body passed on that parses (with the standard library) as a JSON object has a top-level
  ``cache_salt`` whose tag verifies under the context key, and no ``cache_salt`` anywhere inside;
  a tenant's salt only when its token verifies with the one key set (an ``aud``, ``exp``, ``kid``
  and MAC the oracle checks by hand), anything else never a tenant's;
- a body passed on that does not parse as a JSON object names no cache salt in any spelling a form
  parser decodes (else the client's salt would reach vLLM unscoped);
- nothing passed on nests deeper than the middleware's bound.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar
from urllib.parse import unquote_to_bytes

from benchmarks.hostile_mutate import Chooser, mutate_bytes, mutate_json
from benchmarks.hostile_oracle import judge_context
from benchmarks.hostile_targets import (
    CONTEXT_AUDIENCE,
    CONTEXT_KEY,
    CONTEXT_LIFETIME_S,
    CONTEXT_WRONG_KEY,
    Target,
    Verdict,
    call,
    dumps,
    encode,
)

_SALT = re.compile(rb"cache.?salt", re.IGNORECASE)
_DEPTH_LIMIT = 64


def _depth(v: Any) -> int:
    best, stack = 0, [(v, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict | list):
            best = max(best, d)
            stack.extend((y, d + 1) for y in (x.values() if isinstance(x, dict) else x))
    return best


def _names_salt(v: Any) -> bool:
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if "cache_salt" in x:
                return True
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return False


class VllmBodyTarget(Target):
    """Request bodies through the vLLM scope middleware's :func:`scope_body` (any route)."""

    name = "vllm_body"
    share = 0.03
    max_len: ClassVar[int] = 20000

    def _token(self, **over: Any) -> str:
        import time

        from semgov.context import make_context_token

        args: dict[str, Any] = {"audience": CONTEXT_AUDIENCE, "tenant": "acme", "namespace": "ns1",
                                "task": {"id": "qa", "version": "1"},
                                "response_contract": {"id": "c", "schema_sha256": "a" * 64}}  # fmt: skip
        args.update(over)
        args.setdefault("expires_at", int(time.time()) + 600)
        return make_context_token(CONTEXT_KEY, **args)

    def seeds(self) -> list[bytes]:
        tok = self._token()
        docs: list[Any] = [
            {
                "model": "m",
                "prompt": [1, 2, 3],
                "max_tokens": 1,
                "kv_transfer_params": {"semgov_context": tok},
            },
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "cache_salt": "mine",
                "kv_transfer_params": {"semgov_context": tok},
            },  # fmt: skip
            {"model": "m", "input": "hi", "cache_salt": "x"},
            {
                "model": "m",
                "prompt": "hi",
                "kv_transfer_params": {"semgov_context": self._token(audience="other")},
            },
            {
                "model": "m",
                "prompt": "hi",
                "kv_transfer_params": {"semgov_context": self._token(expires_at=1)},
            },
            {"model": "m", "token_ids": [1, 2], "sampling_params": {"max_tokens": 1}},
            [{"prompt": "a", "cache_salt": "x"}],
        ]
        raw = [json.dumps(d).encode() for d in docs]
        form = b"--b\r\nContent-Disposition: form-data; name=file\r\n\r\n\x00[{\r\n--b--"
        return raw + [b"model=m&cache%5Fsalt=x", form, b"", b"null", b'{"a":' * 70 + b"1" + b"}" * 70]

    def dictionary(self) -> list[bytes]:
        return [b'"cache_salt":', b'"kv_transfer_params":', b'"semgov_context":', b"cache%5Fsalt", b"\x00",
                b"[[[[", b"{{", b"\\u005f", b"\xff\xfe"]  # fmt: skip

    def mutate(self, ch: Chooser) -> bytes:
        data = ch.pick(self.seed_list)
        k = ch.int(0, 5)
        if k <= 1:
            for _ in range(ch.int(1, 4)):
                data, _ = mutate_bytes(ch, data)
            return data
        try:
            doc = json.loads(data)
        except ValueError:
            return data + ch.pick(
                (b"&cache_salt=y", b"CACHE-SALT", b"", b"\x00c\x00a\x00c\x00h\x00e\x00_\x00s\x00a\x00l\x00t")
            )
        if k <= 3:
            tree, _ = mutate_json(ch, doc)
            return encode(dumps(tree, ascii_only=ch.chance(0.3), compact=ch.chance(0.8)))
        if k == 4 and isinstance(
            doc, dict
        ):  # a salt placed where it cannot be scoped, or a token of another key
            where = ch.pick(("kv_transfer_params", "messages", "sampling_params", "extra_body", "top"))
            if where == "top":
                doc["cache_salt"] = ch.pick(("s", "", None, 7, ["s"], {"x": 1}))
            else:
                doc[where] = {"cache_salt": "s"} if ch.chance(0.5) else [{"cache_salt": "s"}]
            if ch.chance(0.3):
                from semgov.context import make_context_token

                forged = make_context_token(
                    CONTEXT_WRONG_KEY, audience=CONTEXT_AUDIENCE, tenant="acme", namespace="ns1",
                    task={"id": "qa", "version": "1"},
                    response_contract={"id": "c", "schema_sha256": "a" * 64},
                )  # fmt: skip
                doc["kv_transfer_params"] = {"semgov_context": forged}
            return json.dumps(doc).encode(ch.pick(("utf-8", "utf-16", "utf-32")))
        depth = ch.pick((63, 64, 65, 1000))
        return b'{"a":' * depth + b"1" + b"}" * depth

    def run(self, data: bytes) -> Verdict:
        from engine_hooks.vllm.scope import Refused, issued_salt, scope_body
        from semgov.context import ContextKeys

        v = Verdict()
        keys = ContextKeys(CONTEXT_KEY, CONTEXT_AUDIENCE, (), CONTEXT_LIFETIME_S)
        got = call(scope_body, keys, data, allowed=(Refused,), label="scope_body")
        if isinstance(got, Refused):
            v.reasons.append(got.message)
            if not 400 <= got.status < 500 or not got.message:
                v.crashes.append(f"refused with {got.status} and no 4xx reason")
            return v
        v.accepted = True
        out, scoped = got
        try:
            doc = json.loads(out)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            if not issued_salt(CONTEXT_KEY, doc.get("cache_salt")):
                v.allows.append("a JSON object passed on without an issued salt")
            if any(_names_salt(x) for x in doc.values()):
                v.allows.append("a nested cache_salt passed on")
            if _depth(doc) > _DEPTH_LIMIT:
                v.allows.append("JSON deeper than the bound passed on")
            params = doc.get("kv_transfer_params")
            tok = params.get("semgov_context") if isinstance(params, dict) else None
            import time

            j = judge_context(tok, None, CONTEXT_KEY, audience=CONTEXT_AUDIENCE, now=int(time.time()),
                              max_lifetime_s=CONTEXT_LIFETIME_S) if tok is not None else None  # fmt: skip
            tenant = scoped.tenant if scoped is not None else None
            if tenant is not None and (j is None or j.problems):
                v.allows.append("a tenant salt for a token the oracle refuses")
            return v
        if doc is not None and _names_salt(doc):
            v.allows.append("a cache_salt passed on in JSON that is not an object")
        if doc is None:
            flat = out.replace(b"\x00", b"")
            if _SALT.search(flat) or _SALT.search(unquote_to_bytes(flat.replace(b"+", b" "))):
                v.allows.append("a body semgov cannot parse passed on naming a cache salt")
        return v
