"""How fast the fleet fills: one checkpoint onto 2, 4 and 8 boxes, three ways, on links of one rate.

    sudo .venv/bin/python bench/model_fill_bench.py [--write-docs]     (needs root, iproute2, sshd)

A checkpoint of a few files (64 MiB in all by default; its lock is built from the bytes with the
lock file's own code) reaches N boxes three ways, each timed from its first byte to the last box
whole, and each time is printed as a ratio to ONE box's copy (box to box, alone) of the same run:
1. hub: every box fetches from the hub stand-in at once, so every download shares the hub's link;
2. seed: one box (the seed) fetches from the hub, then every other box pulls from it at once, so
   every pull shares the seed's link;
3. box to box: the seed fetches from the hub, then `fill_rounds` pairs holders with needers round
   by round (each round's pulls at once), every box that holds it sending from the next round.
Box to box should take the whole rounds it needs: the hub fetch to the seed, then ceil(log2(N))
doubling rounds (`rounds_needed(1, N - 1)`), so 2, 3 and 4 copies one after the other for 2, 4
and 8 boxes. The bar printed is 1.2 x those whole rounds. The ideal 1.2 x log2(N + 1), rounds
counted as if fractional, is below them for these N (8 boxes: 3.80 < 4 copies), so it is
printed beside the bar, not used as it.

Each box and the hub stand-in is a network namespace with one veth into a bridge that lives in a
namespace of its own, so no packet of the run touches the host's network and nothing of it is
left in the host's namespace. Every veth end gets the same tbf rate on its egress: the host's end
shapes what that host sends (its uplink: the hub's or the seed's, shared by every copy it serves),
the bridge's end shapes what it receives (its downlink). Linux shapes only egress (ingress can
only be policed, which drops packets), so shaping both ends of each pair is how every link gets
the same rate in both directions (200 Mbit/s unless --rate-mbit says otherwise); the uplinks are
what the three ways differ in. The table's last column, the host's CPU busy share during each
fill, says what bound it: near 100 %, the CPUs (ssh, sshd and the copies' processes of every
concurrent copy on one small host), not the links.

The copies are the collection's own code as ansible runs it on a box: lobes.fleet.model_fetch and
lobes.fleet.model_pull started as `python -m ansible_collections.lobes.fleet.plugins.modules.<name>
<args file>` under `ip netns exec`, each box with its own real sshd (ListenAddress its namespace's
address) whose authorized_keys holds the copy keys that lobes.fleet.model_copy_key made and
trusted, with gateway/lobes_model_serve.py as their forced command. Every box of every way is
checked whole (every file's size and sha256 against the lock) after its fill; the boxes are
emptied before the next one.

Namespaces, veths, bridge, sshd processes and the work directory are removed at the end and,
for a run that crashed, at the start (the namespaces named <prefix>-*, the processes inside them
by their pid). Every wait has a timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / ".collections")]

from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (  # noqa: E402
    check_dir,
    final_dir,
)
from ansible_collections.lobes.fleet.plugins.module_utils.models import (  # noqa: E402
    FleetLock,
    fill_rounds,
    rounds_needed,
    with_model,
)

from bench.docs_section import write_section  # noqa: E402
from tests.support.sshd import PRIVSEP_DIR, Sshd  # noqa: E402

CHECKPOINT = "bench/fill-model"
SERVE = ROOT / "gateway" / "lobes_model_serve.py"
MODULES = "ansible_collections.lobes.fleet.plugins.modules"
OPERATIONS_MD = ROOT / "docs" / "operations.md"
BENCHMARKS_MD = ROOT / "docs" / "benchmarks.md"
SECTION = "model-fill-bench"
SECTION_TITLE = "## How fast the fleet fills: the model-fill benchmark"
FIGURE_ROW = "| model fill: box to box, 2 / 4 / 8 boxes |"
HUB, SEED, BOX_TO_BOX = "hub", "seed", "box to box"
WAYS = (HUB, SEED, BOX_TO_BOX)
BAR = 1.2  # box to box may take this much more than its whole rounds of copies
MIB = 1 << 20


class BenchError(RuntimeError):
    """A step of the benchmark that failed: the command or copy, and what it said."""


def run(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a command (ip, tc) and fail naming it and its stderr when check and it fails."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise BenchError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


# ---------------------------------------------------------------- the checkpoint


def checkpoint_files(total: int, seed: int = 7) -> dict[str, bytes]:
    """A checkpoint of about `total` bytes: a config, a tokenizer and weights in two shards;
    the same bytes for the same seed (the hub's process makes them again)."""
    rand = random.Random(seed).randbytes
    tokenizer = min(MIB, total // 8)
    weights = max(2, total - tokenizer)
    first = weights * 5 // 8
    return {
        "config.json": b'{"model_type": "fill-bench"}\n',
        "tokenizer.json": rand(tokenizer),
        "model-00001-of-00002.safetensors": rand(first),
        "model-00002-of-00002.safetensors": rand(weights - first),
    }


def lock_files(commit: str, files: dict[str, bytes]) -> dict:
    """The lock's files of the revision {path: {size, sha256}}, built with the lock's code."""
    entry = {path: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
             for path, data in files.items()}
    model = with_model(FleetLock(), CHECKPOINT, commit, entry).model(CHECKPOINT)
    return {path: {"size": item.size, "sha256": item.sha256} for path, item in model.files}


# ---------------------------------------------------------------- the network


@dataclass(frozen=True)
class Layout:
    """The namespaces: a switch (the bridge), the hub, boxes 1..count, on one /24."""

    prefix: str = "lfill"
    subnet: str = "10.231.77"
    count: int = 8
    rate_mbit: float = 200.0  # 0: no limit

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def box(self, index: int) -> str:
        return f"{self.prefix}-b{index}"

    def hosts(self) -> list[tuple[str, str, str]]:
        """(namespace, address, the switch's veth name) of the hub and every box."""
        hosts = [(self.hub, f"{self.subnet}.2", "vhub")]
        return hosts + [(self.box(i), f"{self.subnet}.{10 + i}", f"vb{i}")
                        for i in range(1, self.count + 1)]


def _ours(prefix: str) -> list[str]:
    """The namespaces a run with this prefix made (this one's or a crashed one's)."""
    listed = run("ip", "netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.split() and
            line.split()[0].startswith(f"{prefix}-")]


def _pids(netns: str) -> list[int]:
    return [int(pid) for pid in run("ip", "netns", "pids", netns, check=False).stdout.split()]


def _end_processes(netns: str) -> None:
    """End the processes inside a namespace of ours (sshd, the hub, copies), by pid."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids(netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while _pids(netns) and time.monotonic() < deadline:
            time.sleep(0.1)


def teardown(layout: Layout) -> None:
    """Remove every namespace of the prefix, its processes, veths and bridge; idempotent."""
    names = _ours(layout.prefix)
    for netns in names:
        _end_processes(netns)
    if layout.switch in names:
        links = run("ip", "-n", layout.switch, "-o", "link", "show", check=False).stdout
        for line in links.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name != "lo":  # veths explicitly: a namespace's teardown is asynchronous
                run("ip", "-n", layout.switch, "link", "del", name, check=False)
    for netns in names:
        run("ip", "netns", "del", netns, check=False)


def _shape(netns: str, device: str, rate_mbit: float) -> None:
    """The same tbf rate on a device's egress; a burst of 10 ms at the rate (at least 128 KiB:
    a veth hands tbf segments up to 64 KiB)."""
    burst = max(128 * 1024, int(rate_mbit * 1e6 / 8 / 100))
    run("tc", "-n", netns, "qdisc", "replace", "dev", device, "root", "tbf",
        "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "50ms")


def build(layout: Layout) -> None:
    """The switch namespace with its bridge, and each host's namespace wired to it."""
    sw = layout.switch
    run("ip", "netns", "add", sw)
    run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    run("ip", "-n", sw, "link", "set", "br0", "up")
    for netns, address, veth in layout.hosts():
        run("ip", "netns", "add", netns)
        run("ip", "-n", netns, "link", "set", "lo", "up")
        run("ip", "-n", sw, "link", "add", veth, "type", "veth", "peer", "name", "eth0",
            "netns", netns)
        run("ip", "-n", sw, "link", "set", veth, "master", "br0", "up")
        run("ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        run("ip", "-n", netns, "link", "set", "eth0", "up")
        if layout.rate_mbit:
            _shape(netns, "eth0", layout.rate_mbit)
            _shape(sw, veth, layout.rate_mbit)


# ---------------------------------------------------------------- the hub


def serve_hub(address: str, total: int, lifetime: float) -> None:
    """The hub stand-in's process (in the hub's namespace): one commit of the checkpoint,
    its endpoint and commit as one JSON line, served until stdin closes or lifetime ends."""
    from tests.support.hub_standin import HubStandin  # pylint: disable=import-outside-toplevel

    hub = HubStandin(address)
    hub.chunk = 1 << 16  # 4 KiB writes cost the 2-core host more than the link does
    commit = hub.add_commit(CHECKPOINT, checkpoint_files(total))
    hub.start()
    print(json.dumps({"endpoint": hub.endpoint, "commit": commit}), flush=True)
    select.select([sys.stdin], [], [], lifetime)
    hub.stop()


def start_hub(layout: Layout, total: int, lifetime: float) -> tuple[subprocess.Popen, dict]:
    address = layout.hosts()[0][1]
    proc = subprocess.Popen(
        ["ip", "netns", "exec", layout.hub, sys.executable, __file__, "--serve-hub", address,
         "--bytes", str(total), "--lifetime", str(lifetime)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready, _w, _x = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise BenchError("the hub stand-in did not start within 60 s")
    return proc, json.loads(line)


# ---------------------------------------------------------------- boxes and copies


@dataclass
class Box:
    name: str
    netns: str
    address: str
    model_dir: Path
    sshd: Sshd

    def final(self, commit: str) -> Path:
        return Path(final_dir(str(self.model_dir), CHECKPOINT, commit))

    def empty(self) -> None:
        """Remove the checkpoint and any staging copy (the copy key stays)."""
        for top in (CHECKPOINT.split("/", maxsplit=1)[0], ".partial"):
            shutil.rmtree(self.model_dir / top, ignore_errors=True)


@dataclass
class Fleet:
    """The running namespaces: the hub, the boxes, the checkpoint's revision and lock files."""

    layout: Layout
    work: Path
    boxes: list[Box]
    endpoint: str
    commit: str
    files: dict
    hub: subprocess.Popen
    timeout: float = 300.0
    args_made: int = 0

    def whole(self, box: Box) -> bool:
        """Every file of the lock in the box's final directory, size and sha256 checked."""
        return check_dir(str(box.final(self.commit)), self.files, use_manifest=False).whole


def start_module(fleet: Fleet, box: Box, name: str, args: dict) -> subprocess.Popen:
    """One module run on the box as ansible runs it: python -m <module> <args file>."""
    fleet.args_made += 1
    args_file = fleet.work / "args" / f"{fleet.args_made:04d}-{name}-{box.name}.json"
    args_file.parent.mkdir(parents=True, exist_ok=True)
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
        **args, "_ansible_check_mode": False, "_ansible_diff": False}}))
    return subprocess.Popen(
        ["ip", "netns", "exec", box.netns, sys.executable, "-m", f"{MODULES}.{name}",
         str(args_file)],
        env={**os.environ, "PYTHONPATH": str(ROOT / ".collections")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: list[tuple[str, subprocess.Popen]], timeout: float) -> list[dict]:
    """Each module's result, once all end; fails naming the first that failed or overran."""
    deadline = time.monotonic() + timeout
    results = []
    try:
        for what, proc in procs:
            try:
                out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise BenchError(f"{what} did not end within {timeout:.0f} s") from None
            try:
                result = json.loads(out)
            except ValueError:
                raise BenchError(f"{what}: {(out + err).strip()[-500:]}") from None
            if result.get("failed"):
                raise BenchError(f"{what}: {result.get('msg')}")
            results.append(result)
    finally:
        for _what, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
    return results


def at_once(fleet: Fleet, jobs: list[tuple[Box, str, dict]]) -> list[dict]:
    """Start every job's module, then wait for all of them."""
    procs = [(f"{name} on {box.name}", start_module(fleet, box, name, args))
             for box, name, args in jobs]
    return finish(procs, fleet.timeout)


def fetch_job(fleet: Fleet, box: Box) -> tuple[Box, str, dict]:
    return box, "model_fetch", {
        "checkpoint": CHECKPOINT, "revision": fleet.commit, "endpoint": fleet.endpoint,
        "model_dir": str(box.model_dir), "timeout": 30}


def pull_job(fleet: Fleet, box: Box, source: Box) -> tuple[Box, str, dict]:
    return box, "model_pull", {
        "checkpoint": CHECKPOINT, "revision": fleet.commit, "files": fleet.files,
        "model_dir": str(box.model_dir), "source": source.address,
        "ssh_user": source.sshd.user, "ssh_port": source.sshd.port, "timeout": 30}


# ---------------------------------------------------------------- the three ways


def from_hub(fleet: Fleet, boxes: list[Box]) -> None:
    at_once(fleet, [fetch_job(fleet, box) for box in boxes])


def from_seed(fleet: Fleet, boxes: list[Box]) -> None:
    seed, rest = boxes[0], boxes[1:]
    at_once(fleet, [fetch_job(fleet, seed)])
    if rest:
        at_once(fleet, [pull_job(fleet, box, seed) for box in rest])


def box_to_box(fleet: Fleet, boxes: list[Box]) -> None:
    seed, by_name = boxes[0], {box.name: box for box in boxes}
    at_once(fleet, [fetch_job(fleet, seed)])
    for pairs in fill_rounds([seed.name], [box.name for box in boxes[1:]]):
        at_once(fleet, [pull_job(fleet, by_name[dest], by_name[source])
                        for source, dest in pairs])


FILLS: dict[str, Callable[[Fleet, list[Box]], None]] = {
    HUB: from_hub, SEED: from_seed, BOX_TO_BOX: box_to_box}


def cpu_ticks() -> tuple[int, int]:
    """The host's CPU ticks so far: (busy, all), from /proc/stat."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle and iowait
    return sum(ticks) - idle, sum(ticks)


def fill(fleet: Fleet, way: str, count: int) -> tuple[float, float]:
    """Empty every box, fill the first `count` one way; the seconds it took and the share of
    the host's CPU time that was busy meanwhile (near 1: the CPUs, not the links, bound it)."""
    for box in fleet.boxes:
        box.empty()
    busy, total = cpu_ticks()
    started = time.monotonic()
    FILLS[way](fleet, fleet.boxes[:count])
    seconds = time.monotonic() - started
    busy_after, total_after = cpu_ticks()
    return seconds, (busy_after - busy) / max(1, total_after - total)


def one_copy(fleet: Fleet, repeats: int) -> tuple[float, float]:
    """Median seconds of one box's copy alone: from the hub, and box to box."""
    first, second = fleet.boxes[0], fleet.boxes[1]
    hub, pull = [], []
    for _round in range(repeats):
        first.empty()
        started = time.monotonic()
        at_once(fleet, [fetch_job(fleet, first)])
        hub.append(time.monotonic() - started)
        second.empty()
        started = time.monotonic()
        at_once(fleet, [pull_job(fleet, second, first)])
        pull.append(time.monotonic() - started)
    return statistics.median(hub), statistics.median(pull)


# ---------------------------------------------------------------- setting up


def trust_copy_keys(fleet: Fleet) -> None:
    """Each box's copy key (model_copy_key), every one trusted by every box's sshd to run
    the copy server on that box's models directory, and nothing else."""
    made = at_once(fleet, [(box, "model_copy_key", {"model_dir": str(box.model_dir)})
                           for box in fleet.boxes])
    keys = [result["public_key"] for result in made]
    at_once(fleet, [(box, "model_copy_key", {
        "state": "authorized", "public_keys": keys,
        "authorized_keys": str(box.sshd.authorized_keys), "serve": str(SERVE),
        "python": sys.executable, "model_dir": str(box.model_dir)}) for box in fleet.boxes])


def start_fleet(layout: Layout, work: Path, total: int, lifetime: float) -> Fleet:
    """Namespaces, the hub with the checkpoint, each box's sshd and trusted copy keys."""
    build(layout)
    hub, started = start_hub(layout, total, lifetime)
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    boxes = []
    for netns, address, _veth in layout.hosts()[1:]:
        name = netns[len(layout.prefix) + 1:]
        sshd = Sshd(work / "sshd" / name, port=22, address=address, netns=netns)
        boxes.append(Box(name, netns, address, work / "boxes" / name / "models", sshd))
    fleet = Fleet(layout, work, boxes, started["endpoint"], started["commit"],
                  lock_files(started["commit"], checkpoint_files(total)), hub)
    for box in boxes:
        box.sshd.start()
    trust_copy_keys(fleet)
    return fleet


def clean(layout: Layout, work: Path) -> None:
    """What this run (or a crashed one) left: namespaces with their processes, the work dir."""
    teardown(layout)
    shutil.rmtree(work, ignore_errors=True)


# ---------------------------------------------------------------- the report


@dataclass(frozen=True)
class Row:
    count: int
    way: str
    seconds: float
    ratio: float
    busy: float = 0.0  # the host's CPU busy share during the fill

    @property
    def bound(self) -> float | None:
        """Box to box's bar: 1.2 x its whole rounds (the hub fetch, then the doubling)."""
        return BAR * whole_rounds(self.count) if self.way == BOX_TO_BOX else None

    @property
    def verdict(self) -> str:
        if self.bound is None:
            return "-"
        return "PASS" if self.ratio <= self.bound else "MISS"


def whole_rounds(count: int) -> int:
    """Copies one after the other that fill `count` boxes box to box: the hub fetch to the
    seed, then ceil(log2(count)) doubling rounds."""
    return 1 + rounds_needed(1, count - 1)


def table(rows: list[Row], hub_one: float, unit: float) -> str:
    lines = ["| boxes | way | seconds | ratio to one copy | log2(N+1) | bar: 1.2 x whole rounds | "
             "box to box | host CPU busy |", "|---:|---|---:|---:|---:|---:|---|---:|",
             f"| 1 | one copy from the hub | {hub_one:.2f} | {hub_one / unit:.2f}x | | | | |",
             f"| 1 | one copy box to box (the unit) | {unit:.2f} | 1.00x | | | | |"]
    for row in rows:
        bound = f"{row.bound:.2f}x ({whole_rounds(row.count)} rounds)" if row.bound else ""
        lines.append(f"| {row.count} | {row.way} | {row.seconds:.2f} | {row.ratio:.2f}x | "
                     f"{math.log2(row.count + 1):.2f} | {bound} | {row.verdict} | "
                     f"{row.busy:.0%} |")
    return "\n".join(lines)


def host_line() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, Python " \
           f"{platform.python_version()}"


def method(args: argparse.Namespace, total: int, loads: tuple[float, float]) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = run("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD", check=False).stdout
    counts = ", ".join(str(count) for count in sorted(args.boxes))
    return (
        f"Measured on {host_line()}, {when}, at `{commit.strip()}`, the host's 1-minute load "
        f"average {loads[0]:.1f} at the start and {loads[1]:.1f} at the end (other work shares "
        "this machine; the last column is the host's CPU busy share during each fill): a "
        f"checkpoint of four files, {total / MIB:.0f} MiB in all, onto {counts} boxes, each box "
        "and the hub stand-in a "
        f"network namespace on one bridge, every link limited to {args.rate_mbit:g} Mbit/s "
        "(tbf on both ends of each veth, so each host's uplink and downlink). The copies are "
        "`lobes.fleet.model_fetch` (from the hub) and `lobes.fleet.model_pull` (over a real "
        "sshd per box, the copy key's forced command serving), run as modules under `ip netns "
        "exec`; every box is checked whole against the lock after each fill. Each time is a "
        "ratio to one box's copy alone, box to box, the median of "
        f"{args.repeats} in the same run. Box to box's bar is 1.2 x the whole rounds it needs "
        "(the hub fetch to the seed, then ceil(log2(N)) doubling rounds: 2, 3 and 4 copies for "
        "2, 4 and 8 boxes); 1.2 x log2(N+1), rounds counted as if fractional, is below those "
        "for N = 2, 4, 8. The "
        "command (root): `.venv/bin/python bench/model_fill_bench.py --write-docs`.")


def figure_row(rows: list[Row], hub_one: float, unit: float) -> str:
    def ratios(way: str) -> str:
        return " / ".join(f"{row.ratio:.2f}x" for row in rows if row.way == way)

    mine = [row for row in rows if row.way == BOX_TO_BOX]
    verdicts = " / ".join(row.verdict for row in mine)
    bars = " / ".join(f"{row.bound:.1f}x" for row in mine)
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{FIGURE_ROW} one box's copy alone, same run (bar: 1.2x the whole rounds, "
            f"{bars}) | **{ratios(BOX_TO_BOX)}** ({verdicts}); every box from the hub "
            f"{ratios(HUB)}, all from one seed {ratios(SEED)}; one copy {unit:.2f} s "
            f"(from the hub {hub_one / unit:.2f}x) | {host_line()}, {when} | "
            "`.venv/bin/python bench/model_fill_bench.py --write-docs` (root; the method is in "
            "[operations.md](operations.md), \"How fast the fleet fills\") |")


def write_figure_row(row: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace this benchmark's row of "Current figures", or add it as the table's last row."""
    lines = path.read_text().splitlines()
    mine = [i for i, line in enumerate(lines) if line.startswith(FIGURE_ROW)]
    if mine:
        lines[mine[0]] = row
    else:
        start = lines.index("## Current figures")
        header = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
        end = next(i for i in range(header, len(lines)) if not lines[i].startswith("|"))
        lines.insert(end, row)
    path.write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------- running it


def measure(fleet: Fleet, counts: list[int], repeats: int) -> tuple[list[Row], float, float]:
    """One copy alone (the unit), then every way for every count, each box checked whole."""
    hub_one, unit = one_copy(fleet, repeats)
    rows = []
    for count in counts:
        for way in WAYS:
            seconds, busy = fill(fleet, way, count)
            broken = [box.name for box in fleet.boxes[:count] if not fleet.whole(box)]
            if broken:
                raise BenchError(f"{way}, {count} boxes: not whole on {', '.join(broken)}")
            rows.append(Row(count, way, seconds, seconds / unit, busy))
            print(f"{count} boxes, {way}: {seconds:.2f} s ({seconds / unit:.2f}x), host CPU "
                  f"{busy:.0%} busy", flush=True)
    return rows, hub_one, unit


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boxes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--mib", type=float, default=64, help="the checkpoint's size")
    parser.add_argument("--rate-mbit", type=float, default=200, help="every link's rate")
    parser.add_argument("--repeats", type=int, default=3, help="copies alone for the unit")
    parser.add_argument("--prefix", default="lfill", help="the namespaces' name prefix")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lobes-model-fill-bench"))
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--serve-hub", metavar="ADDRESS", help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--lifetime", type=float, default=1800, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def unmet_needs() -> str | None:
    """Why the benchmark cannot run here, or None."""
    if os.geteuid() != 0:
        return "it needs root (network namespaces, tc)"
    for tool in ("ip", "tc", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (iproute2, openssh-client)"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return "sshd is not installed (openssh-server)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.serve_hub:
        serve_hub(args.serve_hub, args.bytes, args.lifetime)
        return 0
    unmet = unmet_needs()
    if unmet:
        print(f"model_fill_bench: {unmet}", file=sys.stderr)
        return 2
    total = int(args.mib * MIB)
    layout = Layout(prefix=args.prefix, count=max([*args.boxes, 2]), rate_mbit=args.rate_mbit)
    clean(layout, args.work)
    load_before = os.getloadavg()[0]
    try:
        fleet = start_fleet(layout, args.work, total, args.lifetime)
        rows, hub_one, unit = measure(fleet, sorted(args.boxes), args.repeats)
    finally:
        clean(layout, args.work)
    loads = (load_before, os.getloadavg()[0])
    text = table(rows, hub_one, unit)
    print(text)
    if args.write_docs:
        paragraph = textwrap.fill(method(args, total, loads), 100, break_on_hyphens=False)
        write_section(SECTION, f"{paragraph}\n\n{text}", SECTION_TITLE, OPERATIONS_MD)
        write_figure_row(figure_row(rows, hub_one, unit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
