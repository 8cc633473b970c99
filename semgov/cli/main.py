"""``semgov`` command line: thin adapters over the core."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from semgov import __version__, log
from semgov.cli import audit, bench, calibrate, check, diff, keys, policy, schema, verify
from semgov.errors import SemgovError

EPILOG = """\
exit status: 0 success; 1 decisions differ from expectations (check), a policy change
flips decisions (diff) or a signature failed;
2 bad input (malformed lines, unreadable files, invalid policy or usage);
3 `audit verify` without a key (UNVERIFIED: pass --pubkey, --keyring or --structure-only).
Docs: README.md, docs/policy.md, docs/rego.md, docs/formats.md."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="semgov",
        description="Policy-as-code governance for semantic KV-cache reuse: decide, per donor "
        "candidate, whether reusing its KV is safe, and sign every decision.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"semgov {__version__}")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="diagnostics on stderr as text (default) or JSON lines",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    check.register(sub)
    diff.register(sub)
    audit.register(sub)
    policy.register(sub)
    keys.register(sub)
    verify.register(sub)
    schema.register(sub)
    bench.register(sub)
    calibrate.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    log.configure(args.log_format)
    try:
        rc: int = args.func(args)
    except SemgovError as e:
        log.get_logger().error(e.diagnostic())
        return 2
    except BrokenPipeError:
        return 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
