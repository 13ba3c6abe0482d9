"""What the monitoring box's Prometheus scrapes, and how it runs: pure functions of the mesh plan.

Every box's gateway is scraped at its origin (the address its peers use) on /metrics, which the
gateway serves keyless whether or not its inbound gate is on: no key ever enters prometheus.yml.
A gear's own /metrics (vLLM's, or lobes_sim's stand-in) listens only inside its box (127.0.0.1
in the process runtime, unpublished under compose), so every gear is scraped through its box's
gateway, which relays it at /metrics/gears/<role> (keyless, as vLLM serves its own): one target
per gear, at its box's origin, its path set by the target's __metrics_path__ label.
"""

from __future__ import annotations

from ansible_collections.lobes.fleet.plugins.module_utils.contract import (
    OriginError,
    host_port,
    parse_http_origin,
)
from ansible_collections.lobes.fleet.plugins.module_utils.schema import ListenAddress, Refused

GATEWAY_JOB = "lobes-gateway"
GEAR_JOB = "lobes-gear"
METRICS_PATH = "/metrics"
GEAR_METRICS_PATH = "/metrics/gears/{role}"


class MonitoringError(ValueError):
    """A plan or setting the monitoring configuration cannot be made from; names the field."""


def origin_address(host: str, origin: str) -> str:
    """host:port of a box's gateway origin (the inventory holds plain-HTTP origins)."""
    try:
        return host_port(*parse_http_origin(origin))
    except OriginError as exc:
        raise MonitoringError(f"host {host}, field fleet_origin: {exc.problem}; the gateway's "
                              "/metrics is scraped there") from None


def gateway_targets(plan: dict) -> list:
    """One target per box of the mesh: its gateway's /metrics at its origin, labelled box."""
    targets = []
    for host, box in sorted(plan["boxes"].items()):
        targets.append({"job": GATEWAY_JOB, "address": origin_address(host, box["origin"]),
                        "labels": {"box": host}})
    return targets


def gear_targets(plan: dict) -> list:
    """One target per gear of the mesh: its /metrics as its box's gateway relays it."""
    targets = []
    for host, box in sorted(plan["boxes"].items()):
        address = origin_address(host, box["origin"])
        for name, role in sorted(box["roles"].items()):
            if role["gear"]:
                labels = {"box": host, "role": name,
                          "__metrics_path__": GEAR_METRICS_PATH.format(role=name)}
                targets.append({"job": GEAR_JOB, "address": address, "labels": labels})
    return targets


def scrape_targets(plan: dict) -> list:
    """Every target of the monitoring box's Prometheus: the gateways, then the gears."""
    return gateway_targets(plan) + gear_targets(plan)


def _static_config(target: dict) -> dict:
    return {"targets": [target["address"]], "labels": dict(target["labels"])}


def prometheus_config(plan: dict, settings: dict) -> dict:
    """prometheus.yml: global intervals, the rule files, one scrape job per kind of target.

    settings: scrape_interval, evaluation_interval (Prometheus durations), rule_files (paths
    relative to prometheus.yml)."""
    targets = scrape_targets(plan)
    jobs = []
    for job in (GATEWAY_JOB, GEAR_JOB):
        configs = [_static_config(target) for target in targets if target["job"] == job]
        if configs:
            jobs.append({"job_name": job, "metrics_path": METRICS_PATH, "static_configs": configs})
    return {
        "global": {"scrape_interval": settings["scrape_interval"],
                   "evaluation_interval": settings["evaluation_interval"]},
        "rule_files": list(settings["rule_files"]),
        "scrape_configs": jobs,
    }


def local_address(listen_address: str) -> str:
    """Where a client on the monitoring box reaches a Prometheus listening on `listen_address`."""
    try:  # the inventory's own reader of the field, so the two never differ
        ListenAddress().read(listen_address)
    except Refused as exc:
        raise MonitoringError(f"field monitoring_listen_address: {listen_address!r} is "
                              f"{exc.reason} ({ListenAddress().describe()})") from None
    host, _colon, port = listen_address.rpartition(":")
    if host in ("", "0.0.0.0"):
        return f"127.0.0.1:{port}"
    if host == "[::]":
        return f"[::1]:{port}"
    return listen_address


def prometheus_service(prometheus: str, settings: dict) -> dict:
    """The supervisor's (or systemd's) service entry that runs Prometheus from its directory.

    settings: listen_address, retention (a Prometheus duration), rule_files. The service
    restarts when prometheus.yml or a rule file changes (its watch list)."""
    local_address(settings["listen_address"])
    return {
        "name": "prometheus",
        "argv": [prometheus, "--config.file=prometheus.yml", "--storage.tsdb.path=data",
                 f"--storage.tsdb.retention.time={settings['retention']}",
                 f"--web.listen-address={settings['listen_address']}"],
        "cwd": ".",
        "env": {},
        "pidfile": "prometheus.pid",
        "log": "prometheus.log",
        "watch": ["prometheus.yml", *settings["rule_files"]],
    }


def services_file(monitoring_host: str, prometheus: str, settings: dict) -> dict:
    """services.json of the monitoring directory: Prometheus alone."""
    return {"version": 1, "host": monitoring_host,
            "services": [prometheus_service(prometheus, settings)]}
