"""A machine baseline printed next to the audit benchmarks' figures (the machine is shared).

``baseline(directory)`` measures, on this machine and file system, the three costs the audit
log is made of: an ``fsync`` after a 4 KiB append, an Ed25519 signature and verification
(``cryptography``), and SHA-256 throughput. Compare figures from two runs only together with
their baselines. ``quick=True`` (the scripts' ``--smoke``) measures a tenth as much.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def _fsync_ms(directory: Path, n: int = 200) -> float:
    fd, name = tempfile.mkstemp(prefix=".fsync-probe-", dir=directory)
    try:
        block = os.urandom(4096)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3
    finally:
        os.close(fd)
        os.unlink(name)


def _ed25519_us(n: int = 2000) -> tuple[float, float]:
    key = Ed25519PrivateKey.generate()
    pub = key.public_key()
    msg = os.urandom(1700)
    t = time.perf_counter()
    sigs = [key.sign(msg) for _ in range(n)]
    sign = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for s in sigs:
        pub.verify(s, msg)
    verify = (time.perf_counter() - t) / n
    return sign * 1e6, verify * 1e6


def _sha256_mb_s(mb: int = 64) -> float:
    data = os.urandom(1 << 20)
    t = time.perf_counter()
    for _ in range(mb):
        hashlib.sha256(data).digest()
    return mb / (time.perf_counter() - t)


def baseline(directory: Path, *, quick: bool = False) -> str:
    """One line: median fsync after a 4 KiB append, Ed25519 sign/verify, SHA-256, load average."""
    fsync = _fsync_ms(directory, 20 if quick else 200)
    sign, verify = _ed25519_us(200 if quick else 2000)
    sha = _sha256_mb_s(8 if quick else 64)
    load = os.getloadavg()[0]
    return (
        f"machine baseline: fsync (4 KiB append) p50 {fsync:.2f} ms, Ed25519 sign {sign:.0f} us / "
        f"verify {verify:.0f} us, SHA-256 {sha:,.0f} MB/s, load average {load:.2f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    print(baseline(Path.cwd()))
