"""The role catalog of seed 004: one entry per role the gateway knows by env prefix.

The gateway holds its own copy (gateway/lobes_gateway/catalog.py); a contract test compares
the shared columns (role, prefix, aliases, checkpoint, context, util, status, task).
The serving columns (native window, tool parser, quantization, MTP, simulator profile) are
this collection's alone: they only matter when a gear is rendered.
"""

from __future__ import annotations

from dataclasses import dataclass

LOAD_TESTED = "load-tested"
CONFIGURED = "configured"


@dataclass(frozen=True)
class RoleSpec:
    """One catalog row: what a role is and how its default checkpoint is served."""

    role: str
    prefix: str
    tier_alias: str | None
    compat_alias: str | None
    extra_aliases: tuple[str, ...]
    checkpoint: str
    context: int | None
    gpu_memory_utilization: float | None
    status: str
    task: str
    native_context: int | None = None
    tool_parser: str | None = None
    quantization: str | None = None
    mtp_checkpoint: bool = False
    opt_in: bool = False
    vllm_args: tuple[str, ...] = ()
    max_active: int = 2  # --max-num-seqs default; pooling gears batch many small requests
    hf_overrides: str | None = None  # JSON, merged with a YaRN rope scaling when both apply
    sim_profile: str = "minor"

    @property
    def aliases(self) -> tuple[str, ...]:
        """Every name besides the served id that reaches this role through the gateway."""
        names = (self.tier_alias, self.compat_alias, *self.extra_aliases)
        return tuple(name for name in names if name)

    @property
    def is_audio(self) -> bool:
        return self.task in ("stt", "tts")

    @property
    def native_window(self) -> int | None:
        """The checkpoint's own window: declared where it differs from the default context."""
        return self.native_context or self.context


_RERANKER_OVERRIDES = (
    '{"architectures": ["Qwen3ForSequenceClassification"], '
    '"classifier_from_token": ["no", "yes"], "is_original_qwen3_reranker": true}'
)

ROLES: tuple[RoleSpec, ...] = (
    RoleSpec(
        role="cortex", prefix="PRIMARY", tier_alias="main", compat_alias="hard",
        extra_aliases=("cortex",), checkpoint="sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP",
        context=131072, gpu_memory_utilization=0.30, status=LOAD_TESTED, task="generate",
        tool_parser="qwen3_coder", quantization="modelopt_fp4", mtp_checkpoint=True,
        sim_profile="spark-cortex",
    ),
    RoleSpec(
        # Served trimmed to 32K by default; the checkpoint's own window is 128K (seed 004).
        role="senses", prefix="MULTIMODAL", tier_alias="multimodal", compat_alias="normal",
        extra_aliases=("senses",), checkpoint="coolthor/gemma-4-12B-it-NVFP4A16",
        context=32768, gpu_memory_utilization=0.14, status=LOAD_TESTED, task="generate",
        native_context=131072, tool_parser="gemma4", quantization="compressed-tensors",
        mtp_checkpoint=True, sim_profile="spark-senses",
    ),
    RoleSpec(
        role="minor", prefix="MINOR", tier_alias="minor", compat_alias="cheap",
        extra_aliases=(), checkpoint="Qwen/Qwen3.5-4B", context=32768,
        gpu_memory_utilization=0.10, status=CONFIGURED, task="generate",
        tool_parser="qwen3_coder",
    ),
    RoleSpec(
        role="middle", prefix="MIDDLE", tier_alias=None, compat_alias=None, extra_aliases=(),
        checkpoint="nvidia/Qwen3-14B-NVFP4", context=32768, gpu_memory_utilization=0.12,
        status=CONFIGURED, task="generate", tool_parser="hermes", quantization="modelopt_fp4",
    ),
    RoleSpec(
        role="muse", prefix="MUSE", tier_alias="muse", compat_alias=None, extra_aliases=(),
        checkpoint="nvidia/Gemma-4-31B-IT-NVFP4", context=32768, gpu_memory_utilization=0.55,
        status=CONFIGURED, task="generate", tool_parser="gemma4", quantization="modelopt_fp4",
        opt_in=True,
    ),
    RoleSpec(
        # Its utilization is unmeasured (seed 004): a box that hosts it must declare one.
        role="worker", prefix="WORKER", tier_alias="worker", compat_alias=None, extra_aliases=(),
        checkpoint="unsloth/Qwen3.6-35B-A3B-NVFP4", context=32768, gpu_memory_utilization=None,
        status=CONFIGURED, task="generate", tool_parser="qwen3_coder",
        quantization="modelopt_fp4", opt_in=True,
    ),
    RoleSpec(
        role="embedder", prefix="EMBED", tier_alias=None, compat_alias=None, extra_aliases=(),
        checkpoint="Qwen/Qwen3-Embedding-0.6B", context=8192, gpu_memory_utilization=0.06,
        status=LOAD_TESTED, task="embed", max_active=16,
        vllm_args=("--runner", "pooling", "--convert", "embed"),
        sim_profile="embedder",
    ),
    RoleSpec(
        role="reranker", prefix="RERANK", tier_alias=None, compat_alias=None, extra_aliases=(),
        checkpoint="Qwen/Qwen3-Reranker-0.6B", context=8192, gpu_memory_utilization=0.06,
        status=LOAD_TESTED, task="rerank", max_active=16,
        vllm_args=("--runner", "pooling", "--convert", "classify"),
        hf_overrides=_RERANKER_OVERRIDES,
        sim_profile="reranker",
    ),
    RoleSpec(
        role="stt", prefix="STT", tier_alias=None, compat_alias=None, extra_aliases=(),
        checkpoint="nvidia/parakeet-tdt-0.6b-v2", context=None, gpu_memory_utilization=None,
        status=CONFIGURED, task="stt", sim_profile="audio",
    ),
    RoleSpec(
        role="tts", prefix="TTS", tier_alias=None, compat_alias=None, extra_aliases=(),
        checkpoint="ResembleAI/chatterbox", context=None, gpu_memory_utilization=None,
        status=CONFIGURED, task="tts", sim_profile="audio",
    ),
    RoleSpec(
        role="fallback", prefix="FALLBACK", tier_alias=None, compat_alias=None, extra_aliases=(),
        checkpoint="RedHatAI/Mistral-Small-3.2-24B-Instruct-2506-NVFP4", context=32768,
        gpu_memory_utilization=0.40, status=CONFIGURED, task="generate",
        tool_parser="mistral", quantization="compressed-tensors",
    ),
)

# Capability order of the generate tiers, ascending (seed 004).
TIER_ORDER: tuple[str, ...] = ("minor", "multimodal", "worker", "muse", "main")

# In /v1/models/supported without a role of its own.
CATALOG_ONLY_CANDIDATES: tuple[tuple[str, str], ...] = (
    ("sakamakismile/gemma-4-12B-coder-fable5-composer2.5-MTP-NVFP4", CONFIGURED),
)

ROLE_NAMES: tuple[str, ...] = tuple(spec.role for spec in ROLES)
_BY_ROLE = {spec.role: spec for spec in ROLES}


def role_spec(role: str) -> RoleSpec:
    """The catalog row of a role; KeyError for a name the catalog does not know."""
    return _BY_ROLE[role]


def is_known_role(role: str) -> bool:
    return role in _BY_ROLE


def role_index(role: str) -> int:
    """Stable position of a role in the catalog (used for deterministic ports and ordering)."""
    return ROLE_NAMES.index(role)
