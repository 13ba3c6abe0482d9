"""The read-only surface: GET /health, /v1/models and /metrics (vLLM's metric names)."""

from __future__ import annotations

from typing import Any

from .engine import FINISH_REASONS
from .state import SimState


def models_listing(state: SimState) -> dict[str, Any]:
    """GET /v1/models as vLLM answers it: one served model with its max_model_len."""
    profile = state.profile
    model_id = profile.served_name
    return {
        "object": "list",
        "data": [
            {
                "id": model_id,
                "object": "model",
                "created": state.started,
                "owned_by": "vllm",
                "root": state.model_root or model_id,
                "parent": None,
                "max_model_len": profile.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{state.seed:x}",
                        "object": "model_permission",
                        "created": state.started,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }


def _family(
    lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]
) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels_and_suffix, value in samples:
        lines.append(f"{name}{labels_and_suffix} {float(value)!r}")


def metrics_text(state: SimState) -> str:
    """GET /metrics: Prometheus text exposition with vLLM's names, labelled by model_name."""
    engine = state.engine
    label = f'model_name="{state.profile.served_name}"'
    lines: list[str] = []
    _family(lines, "vllm:num_requests_running", "gauge",
            "Number of requests in model execution batches.",
            [(f"{{{label}}}", len(engine.running))])
    _family(lines, "vllm:num_requests_waiting", "gauge",
            "Number of requests waiting to be processed.",
            [(f"{{{label}}}", len(engine.waiting))])
    _family(lines, "vllm:kv_cache_usage_perc", "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            [(f"{{{label}}}", engine.kv_cache_usage())])
    # Counters: the family is named without _total, the sample with it (prometheus_client).
    _family(lines, "vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
            [(f"_total{{{label}}}", engine.prompt_tokens_total)])
    _family(lines, "vllm:generation_tokens", "counter", "Number of generation tokens processed.",
            [(f"_total{{{label}}}", engine.generation_tokens_total)])
    cache = engine.prefix_cache
    _family(lines, "vllm:prefix_cache_queries", "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(f"_total{{{label}}}", cache.queries_total)])
    _family(lines, "vllm:prefix_cache_hits", "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            [(f"_total{{{label}}}", cache.hits_total)])
    _family(lines, "vllm:request_success", "counter", "Count of successfully processed requests.",
            [(f'_total{{finished_reason="{reason}",{label}}}', engine.finished_total[reason])
             for reason in FINISH_REASONS])
    _family(lines, "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
            [(f'{{block_size="{state.profile.block_size}",enable_prefix_caching="True"}}', 1)])
    return "\n".join(lines) + "\n"
