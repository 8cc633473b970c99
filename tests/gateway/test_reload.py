"""Reloading the tenants file and the context key, and refusing bad files at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from semgov.context import ContextError, ContextKeys, parse_context_token
from semgov.errors import InputError
from semgov.gateway.metrics import GatewayMetrics
from semgov.gateway.reload import Reloader, read_context_key
from tests.gateway.fixtures import KEYS, tenants_yaml, write_files

ROOT = Path(__file__).resolve().parents[2]


def reloader(tmp_path: Path) -> tuple[Reloader, Path, Path]:
    tenants, key = write_files(tmp_path)
    return Reloader(tenants, key, GatewayMetrics.create()), tenants, key


def test_a_changed_file_is_loaded_once_it_reads_the_same_twice(tmp_path: Path) -> None:
    """A new tenants file is installed at the second poll that sees it unchanged, not the first."""
    r, tenants, _ = reloader(tmp_path)
    assert r.tenants.lookup(KEYS["globex"]) is not None
    tenants.write_text(tenants_yaml({"acme": KEYS["acme"]}))
    assert not r.check()  # NOTE: first sight: maybe still being written
    assert r.tenants.lookup(KEYS["globex"]) is not None
    assert r.check()
    assert r.tenants.lookup(KEYS["globex"]) is None and r.tenants.lookup(KEYS["acme"]) is not None
    assert not r.check()  # nothing new


def test_a_bad_file_keeps_the_running_one(tmp_path: Path) -> None:
    """A tenants file that does not load leaves the old one in force, counted as refused."""
    r, tenants, _ = reloader(tmp_path)
    tenants.write_text(tenants_yaml() + "  - id: broken\n")
    assert not r.reload("test")
    assert r.tenants.lookup(KEYS["globex"]) is not None
    text = r.metrics.registry.get_sample_value("semgov_gateway_reloads_total", {"outcome": "refused"})
    assert text == 1.0


def test_a_bad_key_file_keeps_both_running_files(tmp_path: Path) -> None:
    """A too-short context key refuses the whole reload: the new tenants file is not installed either."""
    r, tenants, key = reloader(tmp_path)
    tenants.write_text(tenants_yaml({"acme": KEYS["acme"]}))
    key.write_bytes(b"short")
    assert not r.reload("test")
    assert r.tenants.lookup(KEYS["globex"]) is not None and r.context_key == b"k" * 32


def test_rotating_the_context_key_mints_under_the_new_key(tmp_path: Path) -> None:
    """After the key file is replaced and reloaded, tokens verify under the new key (engines: previous)."""
    import asyncio

    import httpx

    from semgov.gateway import Gateway, GatewayConfig, Target
    from tests.gateway.fixtures import AUDIENCE, FakeEngine, tokenizer_dir

    tenants, key = write_files(tmp_path)
    body = {"prompt": "hello", "max_tokens": 1, "semgov": {"namespace": "acme/x"}}

    async def main() -> list[str]:
        fake = FakeEngine()
        gw = Gateway(
            GatewayConfig(
                tenants, key, AUDIENCE, Target("sglang", await fake.start(), "tiny"), tokenizer_dir()
            )
        )
        await gw.start()
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=gw.app()), base_url="http://gw"
            ) as c:
                h = {"authorization": f"Bearer {KEYS['acme']}"}
                assert (await c.post("/v1/completions", json=body, headers=h)).status_code == 200
                key.write_bytes(b"n" * 40)
                assert gw.reloader.reload("test")
                assert (await c.post("/v1/completions", json=body, headers=h)).status_code == 200
        finally:
            await gw.stop()
            await fake.stop()
        return [b["extra_key"] for b in fake.bodies]

    old, new = asyncio.run(main())
    engines = ContextKeys(b"n" * 40, AUDIENCE, previous=(b"k" * 32,))  # NOTE: the engines rotated first
    assert parse_context_token(engines, old).tenant == "acme"
    assert parse_context_token(engines, new).tenant == "acme"
    with pytest.raises(ContextError, match="MAC"):
        parse_context_token(ContextKeys(b"k" * 32, AUDIENCE), new)


def test_read_context_key_names_the_file(tmp_path: Path) -> None:
    """A missing or short key is refused naming the file."""
    with pytest.raises(InputError, match="cannot read"):
        read_context_key(tmp_path / "none")
    (tmp_path / "k").write_bytes(b"x" * 31)
    with pytest.raises(InputError, match="at least 32 bytes") as e:
        read_context_key(tmp_path / "k")
    assert e.value.source == str(tmp_path / "k")


def test_serve_refuses_a_bad_tenants_file_at_start(tmp_path: Path) -> None:
    """`semgov gateway serve` with a bad tenants file exits 2 naming file, line and problem."""
    tenants, key = write_files(tmp_path)
    tenants.write_text(tenants_yaml().replace("    tenant: acme", "    tenant: acme\n    tenat: x"))
    proc = subprocess.run(
        [sys.executable, "-m", "semgov.cli.main", "gateway", "serve", "--tenants", str(tenants),
         "--context-key", str(key), "--audience", "a", "--engine", "sglang", "--upstream", "http://127.0.0.1:9",
         "--model", "m", "--tokenizer", str(tmp_path)],
        capture_output=True, text=True, cwd=str(ROOT), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"{tenants}:6: keys.0.tenat: unknown key" in proc.stderr


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--capture-dir", "CAP"], "--capture-dir needs --capture-rate"),
        (["--capture-dir", "CAP", "--capture-rate", "0.5", "--capture-provenance-key", "k.pem",
          "--capture-policy-version", "1"], "NAME@VERSION"),
        (["--capture-dir", "CAP", "--capture-rate", "2", "--capture-provenance-key", "k.pem",
          "--capture-policy-version", "default@1"], "(0, 1]"),
        (["--token-lifetime-s", "0"], "--token-lifetime-s"),
    ],
)  # fmt: skip
def test_serve_refuses_bad_settings(tmp_path: Path, extra: list[str], needle: str) -> None:
    """Inconsistent capture flags or a zero token lifetime stop the gateway with a message naming the flag."""
    tenants, key = write_files(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "semgov.cli.main", "gateway", "serve", "--tenants", str(tenants),
         "--context-key", str(key), "--audience", "a", "--engine", "sglang", "--upstream", "http://127.0.0.1:9",
         "--model", "m", "--tokenizer", str(tmp_path), *extra],
        capture_output=True, text=True, cwd=str(ROOT), timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
