"""python3 -m lobes_supervisor --state-dir DIR [--services FILE] {up,down,restart,status,monitor}"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from lobes_service_files import Service, ServicesError, load_services

from . import control, lock, monitor
from .layout import Layout


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m lobes_supervisor",
        description="Keep the services of a services.json running, identified by pidfiles.",
    )
    parser.add_argument(
        "--state-dir",
        required=True,
        type=Path,
        help="directory for run/ (pidfiles, restart counters) and log/",
    )
    parser.add_argument(
        "--services", type=Path, help="services.json (required for up, restart and monitor)"
    )
    parser.add_argument(
        "--watch",
        action="append",
        default=[],
        type=Path,
        help="file or directory whose content change restarts every service",
    )
    parser.add_argument(
        "--exclude", action="append", default=[], help="leave this service alone (repeatable)"
    )
    parser.add_argument("--dry-run", action="store_true", help="report what would change")
    parser.add_argument("command", choices=["up", "down", "restart", "status", "monitor"])
    parser.add_argument("names", nargs="*", help="only these services (default: all)")
    return parser


def _daemonize() -> None:
    """Detach from the caller: the caller's child exits at once, the grandchild runs on."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)


def _services(args: argparse.Namespace) -> list[Service]:
    if args.services is None:
        raise ServicesError(f"{args.command} needs --services")
    return list(load_services(str(args.services)).services)


def _monitor(args: argparse.Namespace, layout: Layout, watch: tuple[str, ...]) -> int:
    spec = next((s for s in _services(args) if s.name in args.names), None)
    if spec is None:
        raise ServicesError(f"no service named {args.names} in {args.services}")
    _daemonize()
    return monitor.run(spec, layout, watch)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    layout = Layout(args.state_dir.resolve())
    # Resolved once, so up and the monitors it starts fingerprint the very same paths.
    if args.services is not None:
        args.services = args.services.resolve()
    watch = tuple(str(path.resolve()) for path in args.watch)
    try:
        if args.command == "monitor":
            return _monitor(args, layout, watch)
        if args.command == "down":
            result = control.down(layout, args.names, args.exclude, dry_run=args.dry_run)
        elif args.command == "status":
            result = control.status(layout, _services(args) if args.services else [])
        else:
            act = control.up if args.command == "up" else control.restart
            result = act(
                layout,
                _services(args),
                args.services,
                args.names,
                args.exclude,
                watch=watch,
                dry_run=args.dry_run,
            )
    except (ServicesError, control.SupervisorError, lock.LockTimeout) as exc:
        print(json.dumps({"failed": True, "msg": str(exc)}))
        return 2
    print(json.dumps({"failed": False, args.command: [asdict(r) for r in result]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
