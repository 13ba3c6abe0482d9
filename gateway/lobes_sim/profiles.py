"""Calibrated simulator profiles: the timing curves and defaults of each simulated gear, as data.

Timing model (see docs/simulator.md): one engine step advances every running sequence by one
token and lasts ``decode_step_s * (1 + batch_slowdown * (batch - 1))``; a step that admits new
sequences also pays ``prefill_base_s + prefill_s_per_token * prompt_tokens`` for them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .prefix_cache import BLOCK_SIZE
from .textgen import CHARS_PER_TOKEN

GENERATE = "generate"
EMBED = "embed"
SCORE = "score"
AUDIO = "audio"


@dataclass(frozen=True)
class Profile:
    """One simulated gear: what it serves and how fast."""

    name: str
    task: str
    served_name: str
    max_model_len: int
    max_num_seqs: int
    decode_step_s: float
    batch_slowdown: float
    prefill_base_s: float
    prefill_s_per_token: float
    natural_length: tuple[int, int]
    kv_cache_tokens: int
    embed_dim: int = 0
    quantization: str | None = None
    # vLLM's --scheduling-policy: fcfs (its default) or priority (waiting requests ordered by
    # their `priority` field, lower first, then by arrival; running ones are not preempted).
    scheduling_policy: str = "fcfs"
    # Characters of text per prompt token: the stand-in tokenizer's grain (vocabularies differ).
    chars_per_token: int = CHARS_PER_TOKEN
    # Output tokens per SSE chunk: a gear with speculative decoding (MTP) sends the tokens one
    # step accepted in one chunk; 1 is plain decoding.
    tokens_per_chunk: int = 1
    # vLLM's --block-size: the prefix cache hashes and counts hits in blocks of it (16 on a
    # GPU; vLLM's CPU build uses 128).
    block_size: int = BLOCK_SIZE

    def step_seconds(self, batch: int) -> float:
        """Decode time of one engine step that advances ``batch`` sequences by one token."""
        if batch <= 0:
            return 0.0
        return self.decode_step_s * (1.0 + self.batch_slowdown * (batch - 1))

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Prefill time of the sequences admitted in one step, ``prompt_tokens`` in total."""
        return self.prefill_base_s + self.prefill_s_per_token * prompt_tokens

    def with_overrides(self, **fields: object) -> Profile:
        """This profile with the non-None ``fields`` replaced (command-line overrides)."""
        given = {key: value for key, value in fields.items() if value is not None}
        return replace(self, **given)

    def with_prefill_scale(self, scale: float) -> Profile:
        """This profile with its prefill costs times ``scale`` (0: prefill is free)."""
        return replace(self, prefill_base_s=self.prefill_base_s * scale,
                       prefill_s_per_token=self.prefill_s_per_token * scale)


# Measured in an acceptance run: Spark serves cortex at 48.9 tok/s single stream (154 tok in
# 3.149 s) and two streams at ~44 tok/s each (155 tok in ~3.5 s), so a 2-slot box makes
# ~88 tok/s aggregate.
# Prefill: 0.37 ms per token puts a 4,096-token uncached prompt at 1.58 s, the 2,575 prefill
# tok/s published for a 27B NVFP4 checkpoint on vLLM on one GB10 (docs/simulator.md).
SPARK_CORTEX = Profile(
    name="spark-cortex",
    task=GENERATE,
    served_name="unsloth/Qwen3.8-27B-NVFP4",
    max_model_len=262144,
    max_num_seqs=2,
    decode_step_s=0.0200,
    batch_slowdown=0.11,
    prefill_base_s=0.060,
    prefill_s_per_token=0.00037,
    natural_length=(154, 155),
    kv_cache_tokens=468886,
    quantization="modelopt_fp4",
)

# Measured in the same run: Thor serves the same checkpoint at 11.0 tok/s single stream (155
# tok in 14.1 s) and holds ~11 tok/s per stream with two running (155 tok in 14.0-14.4 s).
THOR_CORTEX = Profile(
    name="thor-cortex",
    task=GENERATE,
    served_name="unsloth/Qwen3.8-27B-NVFP4",
    max_model_len=262144,
    max_num_seqs=2,
    decode_step_s=0.0900,
    batch_slowdown=0.015,
    prefill_base_s=0.100,
    prefill_s_per_token=0.0010,
    natural_length=(154, 155),
    kv_cache_tokens=262144,
    quantization="modelopt_fp4",
)

SPARK_SENSES = Profile(
    name="spark-senses",
    task=GENERATE,
    served_name="coolthor/gemma-4-12B-it-NVFP4A16",
    max_model_len=32768,
    max_num_seqs=8,
    decode_step_s=0.0120,
    batch_slowdown=0.06,
    prefill_base_s=0.030,
    prefill_s_per_token=0.0001,
    natural_length=(48, 96),
    kv_cache_tokens=184084,
    quantization="modelopt_fp4",
)

MINOR = Profile(
    name="minor",
    task=GENERATE,
    served_name="Qwen/Qwen3.5-4B",
    max_model_len=32768,
    max_num_seqs=16,
    decode_step_s=0.0080,
    batch_slowdown=0.04,
    prefill_base_s=0.015,
    prefill_s_per_token=0.00005,
    natural_length=(32, 80),
    kv_cache_tokens=262144,
)

EMBEDDER = Profile(
    name="embedder",
    task=EMBED,
    served_name="Qwen/Qwen3-Embedding-0.6B",
    max_model_len=8192,
    max_num_seqs=64,
    decode_step_s=0.0,
    batch_slowdown=0.0,
    prefill_base_s=0.004,
    prefill_s_per_token=0.00001,
    natural_length=(0, 0),
    kv_cache_tokens=131072,
    embed_dim=1024,
)

RERANKER = Profile(
    name="reranker",
    task=SCORE,
    served_name="Qwen/Qwen3-Reranker-0.6B",
    max_model_len=8192,
    max_num_seqs=64,
    decode_step_s=0.0,
    batch_slowdown=0.0,
    prefill_base_s=0.004,
    prefill_s_per_token=0.00001,
    natural_length=(0, 0),
    kv_cache_tokens=131072,
)

AUDIO_BRIDGE = Profile(
    name="audio",
    task=AUDIO,
    served_name="realtime-bridge",
    max_model_len=0,
    max_num_seqs=8,
    decode_step_s=0.0,
    batch_slowdown=0.0,
    prefill_base_s=0.020,
    prefill_s_per_token=0.0,
    natural_length=(0, 0),
    kv_cache_tokens=0,
)

# Zero delay everywhere and effectively unlimited slots: measures the gateway, not the model.
INSTANT = Profile(
    name="instant",
    task=GENERATE,
    served_name="sim-instant",
    max_model_len=131072,
    max_num_seqs=1_000_000,
    decode_step_s=0.0,
    batch_slowdown=0.0,
    prefill_base_s=0.0,
    prefill_s_per_token=0.0,
    natural_length=(16, 48),
    kv_cache_tokens=10_000_000,
)

PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        SPARK_CORTEX,
        THOR_CORTEX,
        SPARK_SENSES,
        MINOR,
        EMBEDDER,
        RERANKER,
        AUDIO_BRIDGE,
        INSTANT,
    )
}
