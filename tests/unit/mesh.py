"""Small inventories as data for the fleet model's tests."""

from __future__ import annotations

import copy

SPARK = "http://spark.tail0be7e0.ts.net:8001"
THOR = "http://thor.tail0be7e0.ts.net:8000"


def seed_mesh() -> dict:
    """The seeds' mesh as hostvars: Spark duo + pooling Orin + Thor (a fresh copy each call)."""
    return copy.deepcopy({
        "spark": {
            "fleet_hardware": "gb10", "fleet_gateway_port": 8001,
            "ansible_host": "spark.tail0be7e0.ts.net", "fleet_gateway_api_key": "spark-key",
            "fleet_roles": {
                "cortex": {"context": 262144, "yarn_factor": 2.0, "gpu_memory_utilization": 0.30},
                "senses": {"context": 32768, "gpu_memory_utilization": 0.14},
                "embedder": {}, "reranker": {},
            },
        },
        "thor": {
            "fleet_hardware": "thor", "ansible_host": "thor.tail0be7e0.ts.net",
            "fleet_gateway_open": True,
            "fleet_roles": {
                "cortex": {"context": 262144, "yarn_factor": 2.0, "mtp": False,
                           "gpu_memory_utilization": 0.60},
                "senses": {"feasible": False, "referral": "spark"},
            },
        },
        "orin": {
            "fleet_hardware": "orin", "ansible_host": "orin.tail0be7e0.ts.net",
            "fleet_gateway_api_key": "orin-key",
            "fleet_roles": {
                "cortex": {"feasible": False, "pool": ["spark", "thor"],
                           "rates": {"spark": 48.9, "thor": 11.0}},
                "senses": {"feasible": False, "proxy": "spark"},
                "worker": {"checkpoint": "nvidia/NVIDIA-Nemotron-3.5-Lightning-30B-A3B-NVFP4",
                           "gpu_memory_utilization": 0.60},
            },
        },
    })
