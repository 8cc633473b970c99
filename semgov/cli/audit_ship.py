"""``semgov audit ship`` and ``semgov audit fetch``: a worker's log to an object store and back."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from semgov.errors import InputError

STORE_HELP = (
    "s3://BUCKET[/PREFIX] (any S3-compatible store; boto3 reads credentials, region and endpoint the "
    "usual way: AWS_ACCESS_KEY_ID, AWS_REGION, AWS_ENDPOINT_URL, a profile or a role) or a directory "
    "(a store mounted as a file system, or a staging disk a log pipeline collects)"
)
SHIP_EPILOG = (
    "Objects: <PREFIX>/<origin>/records/<start>-<end>-<size>.frames (bytes of records.log, each ending "
    "with a seal) and <PREFIX>/<origin>/checkpoints/<size>.note, each written once (S3: If-None-Match: *) "
    "and never replaced. Only sealed bytes are sent, in log order; the store's listing says where to go "
    "on, so a restarted shipper neither repeats nor skips. exit status: 0 shipped (or nothing new); "
    "1 the store holds other bytes for a range, its copy has a gap, or the log is damaged; 2 bad input; "
    "4 the store could not be reached (without --follow): nothing was lost, run it again."
)


def register_ship(a: Any, default_dir: Path) -> None:
    s = a.add_parser(
        "ship",
        help="copy a log's sealed records and checkpoints to an object store",
        description="Send every sealed range of the log's records.log and every checkpoint note that the "
        "store does not hold yet, in order. Reads the log only (no lock): run it beside a live writer. With "
        "--follow it keeps shipping, and while the store is unreachable it retries with backoff and the "
        "local log keeps everything.",
        epilog=SHIP_EPILOG,
    )
    s.add_argument("directory", type=Path, nargs="?", default=default_dir, metavar="DIR")
    s.add_argument("--to", required=True, metavar="STORE", help=STORE_HELP)
    s.add_argument(
        "--endpoint-url", metavar="URL", help="an S3-compatible endpoint (default: AWS_ENDPOINT_URL)"
    )
    s.add_argument("--follow", action="store_true", help="keep shipping until SIGTERM or Ctrl-C")
    s.add_argument("--interval-s", type=float, default=5.0, metavar="S", help="seconds between passes (5)")
    s.add_argument("--range-mb", type=float, default=8.0, metavar="MB", help="most MB per object (8)")
    s.set_defaults(func=run_ship)

    f = a.add_parser(
        "fetch",
        help="rebuild logs from an object store, to verify them",
        description="Write each log the store holds (or the one --origin names) as a log directory under "
        "OUT (OUT/<origin with / as _>), for `semgov audit verify`, which checks every frame, signature "
        "and checkpoint and trusts nothing the store says.",
    )
    f.add_argument("store", metavar="STORE", help=STORE_HELP)
    f.add_argument("out", type=Path, metavar="OUT", help="a directory to create the logs in (must not exist)")
    f.add_argument(
        "--origin", metavar="ORIGIN", help="only this log (`semgov audit verify` prints its origin)"
    )
    f.add_argument(
        "--endpoint-url", metavar="URL", help="an S3-compatible endpoint (default: AWS_ENDPOINT_URL)"
    )
    f.set_defaults(func=run_fetch)


def run_ship(args: Any) -> int:
    return _statuses("ship", _ship, args, unreachable=": nothing lost; run it again")


def _statuses(command: str, run: Callable[[Any], int], args: Any, *, unreachable: str = "") -> int:
    """``run(args)``, a store that cannot be reached as exit 4 and any other shipping error as 1."""
    from semgov.audit.ship import ShipError
    from semgov.audit.stores import StoreUnavailable

    try:
        return run(args)
    except StoreUnavailable as e:
        print(f"semgov audit {command}: {e.diagnostic()}{unreachable}", file=sys.stderr)
        return 4
    except ShipError as e:
        print(f"semgov audit {command}: {e.diagnostic()}", file=sys.stderr)
        return 1


def _ship(args: Any) -> int:
    from semgov.audit.shipper import ship_follow, ship_once
    from semgov.audit.stores import open_store

    if args.interval_s <= 0 or args.range_mb <= 0:
        raise InputError("--interval-s and --range-mb must be positive")
    if not (args.directory / "records.log").is_file():
        raise InputError(f"{args.directory}: no audit log here (records.log)", source=str(args.directory))
    store, prefix = open_store(args.to, endpoint_url=args.endpoint_url)
    limit = int(args.range_mb * (1 << 20))
    if args.follow:
        stopping: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda n, _f: stopping.append(n))
        ship_follow(
            args.directory,
            store,
            prefix,
            interval_s=args.interval_s,
            limit=limit,
            stop=lambda: bool(stopping),
        )
        return 0
    done = ship_once(args.directory, store, prefix, limit=limit)
    if not done.origin:
        print(f"{args.directory}: nothing sealed yet, nothing shipped")
        return 0
    print(
        f"{done.origin}: shipped {done.ranges} ranges ({done.bytes} bytes) and {done.notes} checkpoints; "
        f"the store holds records 0..{done.end.size} ({done.end.end} bytes) at {store.where}{prefix}"
    )
    return 0


def run_fetch(args: Any) -> int:
    return _statuses("fetch", _fetch, args)


def _fetch(args: Any) -> int:
    from semgov.audit.shipper import fetch, stored_logs
    from semgov.audit.stores import open_store

    store, prefix = open_store(args.store, endpoint_url=args.endpoint_url)
    origins = [args.origin] if args.origin else stored_logs(store, prefix)
    if not origins:
        raise InputError(f"{args.store}: holds no semgov log", source=args.store)
    if args.out.exists():
        raise InputError(f"{args.out}: exists; name a new directory", source=str(args.out))
    for origin in origins:
        out = args.out / origin.replace("/", "_")
        r = fetch(store, prefix, origin, out)
        print(f"{origin}: {r.size} records ({r.end} bytes) -> {out}")
    return 0
