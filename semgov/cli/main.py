"""``semgov`` command line: thin adapters over the core.

NOTE: start-up: only the module of the command being run is imported (each imports what it
needs); ``semgov``, ``semgov --help`` and ``--version`` import none, so they answer before any
heavy dependency (pydantic, numpy, cryptography, structlog) is loaded. :data:`COMMANDS` keeps
each command's one-line help for the top-level ``--help``; a test holds it equal to the help the
command's own module registers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator, Sequence

from semgov import __version__

# name -> (module that registers it, its one-line help in `semgov --help`), in display order.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("semgov.cli.check", "replay captured requests against a policy"),
    "diff": ("semgov.cli.diff", "compare two policies' decisions on captured requests"),
    "audit": ("semgov.cli.audit", "verify and review an audit log"),
    "policy": ("semgov.cli.policy", "lint and test policies"),
    "keys": ("semgov.cli.keys", "manage Ed25519 signing keys"),
    "provenance": ("semgov.cli.provenance", "sign and verify donor provenance outside an engine"),
    "bundle": ("semgov.cli.bundle", "build and verify signed policy bundles (OPA's bundle format)"),
    "gateway": ("semgov.cli.gateway", "run the OpenAI-compatible gateway that signs each request's context"),
    "verify-decision": ("semgov.cli.verify", "check the signatures of decision records"),
    "schema": ("semgov.cli.schema", "write or check the JSON Schemas generated from the wire types"),
    "bench": ("semgov.cli.bench", "measure what KV reuse saves and what governance costs, on a real model"),
    "calibrate": (
        "semgov.cli.calibrate",
        "measure reuse's answer regressions on captured traffic; write the policy that stays in budget",
    ),
    "contracts": (
        "semgov.cli.contracts",
        "check response contracts and compare two answers the way a contract says",
    ),
    "docs": ("semgov.cli.docs", "read the documentation offline (topics: semgov docs)"),
}

# NOTE: developers' commands (CI checks schemas/ against the models): they run, but `semgov --help`
# does not list them (registered without a help line, argparse lists no choice for them).
HIDDEN = frozenset({"schema"})

EPILOG = """\
exit status: 0 success; 1 decisions differ from expectations or were made by errors alone
(check), a policy change flips decisions (diff), an answer regressed (contracts compare) or a
signature failed;
2 bad input (malformed lines, unreadable files, invalid policy or usage);
3 `audit verify` without a key (UNVERIFIED: pass --pubkey, --keyring or --structure-only).
Docs, offline: `semgov docs` lists the topics, `semgov docs policy` prints one."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``only``: register that command alone (the others are listed with their help,
    their modules not imported; ``""``: none), None: every command."""
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
    for name, (module, help_text) in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(sub)
            _remember_parsers(sub.choices[name])
        elif name in HIDDEN:
            sub.add_parser(name)
        else:
            sub.add_parser(name, help=help_text)
    return p


QUIET_HELP = (
    "print nothing on stdout and log errors only; the exit status says the outcome (files named by "
    "--out are still written)"
)


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)parser under ``parser`` a default naming itself, so an unrecognized flag is
    reported with the usage of the command that got it (the deepest parser's default wins), and
    every command ``-q/--quiet``."""
    parser.set_defaults(_parser=parser)
    children = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not children and "--quiet" not in parser._option_string_actions:
        flags = ("-q", "--quiet") if "-q" not in parser._option_string_actions else ("--quiet",)
        parser.add_argument(*flags, action="store_true", help=QUIET_HELP)
    for action in children:
        for child in action.choices.values():
            _remember_parsers(child)


@contextlib.contextmanager
def _quiet_stdout(quiet: bool) -> Iterator[None]:
    """stdout to nowhere while a ``--quiet`` command runs."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


def command_of(argv: Sequence[str]) -> str:
    """The command named in ``argv`` (the first word that is not an option or its value), or ``""``."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--log-format":
            skip = True
        elif not a.startswith("-"):
            return a if a in COMMANDS else ""
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=command_of(args_in))
    args, extra = parser.parse_known_args(args_in)
    if extra:  # NOTE: the usage of the (sub)command that was given the flag, not the top level's
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    from semgov import log
    from semgov.errors import PolicyError, SemgovError

    quiet = bool(getattr(args, "quiet", False))
    log.configure(args.log_format, quiet=quiet)
    try:
        with _quiet_stdout(quiet):
            rc: int = args.func(args)
    except SemgovError as e:
        # NOTE: an invalid policy: every problem found, not just the first (as `policy check`)
        for line in e.all_diagnostics() if isinstance(e, PolicyError) else [e.diagnostic()]:
            log.get_logger().error(line)
        return 2
    except BrokenPipeError:
        return 0
    return rc


if __name__ == "__main__":
    sys.exit(main())
