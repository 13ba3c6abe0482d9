"""Hardware profiles: what a box of each group can hold and run.

vLLM's --gpu-memory-utilization is a fraction of the device's total memory, taken by each
gear independently (vLLM documents it so), so a box's budget is the sum of its gears' fractions
times that total, plus a headroom for the OS and co-resident services, against the memory
the box can actually give to GPU work.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# The vLLM nightly every default gear runs on the Spark: one digest, fleet-wide.
VLLM_NIGHTLY = (
    "vllm/vllm-openai@sha256:7c5a10e9a8b3c8642f4d0463a41215176c0dd834b4f0967287c7e3e517cf1be9"
)
# Jetson boxes run NVIDIA's L4T vLLM container; override with fleet_gear_image per group.
VLLM_JETSON = "nvcr.io/nvidia/vllm:26.04-py3"


@dataclass(frozen=True)
class HardwareProfile:
    """One hardware group: memory figures in GiB, GPU arch, kernels it has."""

    name: str
    description: str
    arch: str
    memory_gib: float
    usable_gib: float
    headroom_gib: float
    mtp_kernel: bool
    gear_image: str
    has_gpu: bool = True
    simulates: str = ""  # the profile whose budget simulated gears are planned against

    @property
    def gear_budget_gib(self) -> float:
        """Memory the gears may reserve together: usable memory less the headroom."""
        return self.usable_gib - self.headroom_gib

    @property
    def max_utilization(self) -> float:
        """The largest sum of --gpu-memory-utilization fractions that fits the budget."""
        return self.gear_budget_gib / self.memory_gib

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "arch": self.arch,
            "memory_gib": self.memory_gib,
            "usable_gib": self.usable_gib,
            "headroom_gib": self.headroom_gib,
            "mtp_kernel": self.mtp_kernel,
            "gear_image": self.gear_image,
            "has_gpu": self.has_gpu,
            "simulates": PROFILES[self.simulates].description if self.simulates else None,
        }


PROFILES: dict = {
    profile.name: profile
    for profile in (
        HardwareProfile(
            # 128 GB unified, of which 121.7 GiB is the pool CUDA reports; a gear's GiB
            # is its utilization x 128. Headroom: a shared Spark carried 12-20 GiB of other
            # services in the seed's validation run.
            name="gb10", description="NVIDIA DGX Spark (GB10, 128 GB unified)", arch="sm_121",
            memory_gib=128.0, usable_gib=121.7, headroom_gib=20.0, mtp_kernel=True,
            gear_image=VLLM_NIGHTLY,
        ),
        HardwareProfile(
            # No MTP kernel is declared for sm_87; speculative decoding stays off here.
            name="orin", description="NVIDIA Jetson AGX Orin 64 GB", arch="sm_87",
            memory_gib=64.0, usable_gib=61.4, headroom_gib=8.0, mtp_kernel=False,
            gear_image=VLLM_JETSON,
        ),
        HardwareProfile(
            # The checkpoint's MTP variant has no sm_110 kernel image: no MTP here.
            name="thor", description="NVIDIA Jetson AGX Thor 128 GB", arch="sm_110",
            memory_gib=128.0, usable_gib=122.0, headroom_gib=16.0, mtp_kernel=False,
            gear_image=VLLM_JETSON,
        ),
        HardwareProfile(
            # The embedded default: no GPU, simulated gears budgeted as if on a Spark so a
            # local inventory that fits here fits a real one.
            name="sim", description="No GPU: lobes_sim gears standing in for a Spark",
            arch="none", memory_gib=128.0, usable_gib=121.7, headroom_gib=20.0,
            mtp_kernel=True, gear_image="", has_gpu=False, simulates="gb10",
        ),
    )
}


def hardware_profile(name: str) -> HardwareProfile:
    """The profile of a hardware group; KeyError for an unknown name."""
    return PROFILES[name]


def planned_hardware(box_plan: Mapping) -> Mapping:
    """A box plan's hardware (HardwareProfile.as_dict); empty where the plan names no profile:
    hardware null or left out, as a hand-written plan may have it."""
    hardware = box_plan.get("hardware")
    return hardware if isinstance(hardware, Mapping) else {}
