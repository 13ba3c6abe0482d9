"""The static role catalog and supported-model catalog (mirrors plugins/module_utils)."""

from __future__ import annotations

from dataclasses import dataclass

GENERATE = "generate"
EMBED = "embed"
RERANK = "rerank"
AUDIO_STT = "stt"
AUDIO_TTS = "tts"

LOAD_TESTED = "load-tested"
CONFIGURED = "configured"

# Ascending capability order of the generate tiers.
TIER_ORDER: tuple[str, ...] = ("minor", "multimodal", "worker", "muse", "main")
# Full tiers are shed under pressure; minor is the floor and always served.
SHEDDABLE_TIERS = frozenset({"main", "multimodal", "worker", "muse"})
# Opt-in roles: feasible by default only when their backend is wired (inverted feasibility).
OPT_IN_ROLES = frozenset({"muse", "worker"})


@dataclass(frozen=True)
class Role:
    """One catalog row: a named role, its env prefix and its static defaults."""

    name: str
    prefix: str
    tier: str | None
    compat_alias: str | None
    extra_aliases: tuple[str, ...]
    checkpoint: str
    context: int | None
    gpu_util: float | None
    status: str
    task: str

    @property
    def aliases(self) -> tuple[str, ...]:
        """Every model name (besides served names) that selects this role."""
        names = [self.tier, self.compat_alias, *self.extra_aliases]
        return tuple(n for n in names if n)


ROLES: tuple[Role, ...] = (
    Role("cortex", "PRIMARY", "main", "hard", ("cortex",),
         "sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP", 131072, 0.30, LOAD_TESTED, GENERATE),
    Role("senses", "MULTIMODAL", "multimodal", "normal", ("senses",),
         "coolthor/gemma-4-12B-it-NVFP4A16", 32768, 0.14, LOAD_TESTED, GENERATE),
    Role("minor", "MINOR", "minor", "cheap", (),
         "Qwen/Qwen3.5-4B", 32768, 0.10, CONFIGURED, GENERATE),
    Role("middle", "MIDDLE", None, None, (),
         "nvidia/Qwen3-14B-NVFP4", 32768, 0.12, CONFIGURED, GENERATE),
    Role("muse", "MUSE", "muse", None, (),
         "nvidia/Gemma-4-31B-IT-NVFP4", 32768, 0.55, CONFIGURED, GENERATE),
    Role("worker", "WORKER", "worker", None, (),
         "unsloth/Qwen3.6-35B-A3B-NVFP4", 32768, None, CONFIGURED, GENERATE),
    Role("embedder", "EMBED", None, None, (),
         "Qwen/Qwen3-Embedding-0.6B", 8192, 0.06, LOAD_TESTED, EMBED),
    Role("reranker", "RERANK", None, None, (),
         "Qwen/Qwen3-Reranker-0.6B", 8192, 0.06, LOAD_TESTED, RERANK),
    Role("stt", "STT", None, None, (),
         "nvidia/parakeet-tdt-0.6b-v2", None, None, CONFIGURED, AUDIO_STT),
    Role("tts", "TTS", None, None, (),
         "ResembleAI/chatterbox", None, None, CONFIGURED, AUDIO_TTS),
    Role("fallback", "FALLBACK", None, None, (),
         "RedHatAI/Mistral-Small-3.2-24B-Instruct-2506-NVFP4", 32768, 0.40, CONFIGURED, GENERATE),
)

ROLES_BY_NAME: dict[str, Role] = {r.name: r for r in ROLES}

# In /v1/models/supported but held by no role.
CANDIDATES: tuple[tuple[str, str], ...] = (
    ("sakamakismile/gemma-4-12B-coder-fable5-composer2.5-MTP-NVFP4", CONFIGURED),
)

# The role name that owns the primary lane and the one it fails over to.
PRIMARY_ROLE = "cortex"
FALLBACK_ROLE = "fallback"
