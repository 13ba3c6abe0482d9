"""What the live page costs the gateway of the local default: its CPU at idle with no page open
and with /ui open in headless Chromium (polling every 3 s), and how fast the page loads.

    .venv/bin/python bench/ui_idle_bench.py [--seconds 60] [--loads 10] [--write-docs]

site.yml deploys a copy of inventories/local on free ports (as tests/integration does), the
gateway process's utime+stime is read from /proc/<pid>/stat over each window, and the page's
load is its navigation timing (load event) and the first answer drawn (the page's own
`lobes-first-data` mark), over fresh loads. --write-docs rewrites the ui-idle section of
docs/benchmarks.md. Targets: under 1 % CPU added by an open page, a load under 200 ms.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import docs_section

DOCS_TITLE = "## The live page at idle (`bench/ui_idle_bench.py`)"
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "gateway")]

from tests.integration.conftest import supervisor  # noqa: E402
from tests.integration.test_playbooks import LocalMesh  # noqa: E402
from tests.support import browser as ui  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def cpu_percent(pid: int, seconds: float) -> float:
    """The process's CPU over the next `seconds`, in percent of one core."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds(pid) - before) / (time.monotonic() - started)


def first_data_ms(driver) -> float:
    ui.wait_live(driver)
    return driver.execute_script(
        "return performance.getEntriesByName('lobes-first-data')[0].startTime;")


def measure(seconds: float, loads: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ui-idle-bench-") as tmp:
        mesh = LocalMesh(Path(tmp))
        done = mesh.playbook("site.yml")
        if done.returncode != 0:
            raise SystemExit(done.stdout[-3000:] + done.stderr[-3000:])
        try:
            pid = mesh.processes()["gateway"]
            url = f"http://127.0.0.1:{mesh.port}/ui"
            time.sleep(5)  # start-up probes settle
            idle = cpu_percent(pid, seconds)
            with ui.browser() as driver:
                load, first = [], []
                for _load in range(loads):
                    driver.get("about:blank")
                    driver.get(url)
                    first.append(first_data_ms(driver))
                    load.append(ui.load_ms(driver))
                open_page = cpu_percent(pid, seconds)
            return {"idle": idle, "open": open_page, "load_ms": statistics.median(load),
                    "load_max_ms": max(load), "first_ms": statistics.median(first),
                    "first_max_ms": max(first)}
        finally:
            supervisor(mesh.deploy_dir / "state", "down")


def report(figures: dict[str, float], seconds: float, loads: int) -> list[str]:
    added = figures["open"] - figures["idle"]
    return [
        f"Run `python3 bench/ui_idle_bench.py --write-docs` on {platform.machine()} / "
        f"{platform.python_version()}, {date.today().isoformat()}: the local default "
        f"(site.yml on inventories/local, simulated gears) on the 2-core development machine; "
        f"the gateway process's CPU over {seconds:.0f} s each, page loads over {loads} fresh "
        "loads in headless Chromium (median, max).",
        "",
        "| | measured | target |",
        "|---|---:|---|",
        f"| gateway CPU at idle, no page open | {figures['idle']:.2f} % | |",
        f"| gateway CPU at idle, /ui open (polls every 3 s) | {figures['open']:.2f} % | |",
        f"| CPU added by an open page | {added:.2f} % | < 1 % |",
        f"| page load (navigation start to load event) | {figures['load_ms']:.0f} ms "
        f"(max {figures['load_max_ms']:.0f}) | < 200 ms |",
        f"| first data drawn (first /status and /capabilities answered) | "
        f"{figures['first_ms']:.0f} ms (max {figures['first_max_ms']:.0f}) | |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--loads", type=int, default=10)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    lines = report(measure(args.seconds, args.loads), args.seconds, args.loads)
    print("\n".join(lines))
    if args.write_docs:
        docs_section.write_section("ui-idle", "\n".join(lines), title=DOCS_TITLE)


if __name__ == "__main__":
    main()
