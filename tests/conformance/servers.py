"""The two servers of the conformance suite, each a chat gear and an embedding gear, reached
direct or through a real gateway: lobes_sim, and vLLM's CPU build serving the tiny models.

The real engine runs the command line and environment the collection renders for a box's CPU
gear (the plan of an inventory like the golden cpu-engine box's, then render's
cpu_engine_argv), so the suite runs the flags a box runs with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.module_utils.render import (
    cpu_engine_argv,
    cpu_engine_env,
)

from tests.support.client import Reply, call
from tests.support.gateway_proc import GatewayProcess, start_gateway
from tests.support.metrics import Scrape
from tests.support.ports import free_block
from tests.support.sim_proc import start_sim
from tests.support.vllm_proc import EngineInstall, start_vllm

SIM = "sim"
VLLM_CPU = "vllm-cpu"
DIRECT = "direct"
GATEWAY = "gateway"
CHAT_NAME = "tiny-chat"
EMBED_NAME = "tiny-embed"
WINDOW = 2048
EMBED_WINDOW = 512
EMBED_DIM = 128
# The CPU engine's prefix-cache block (vllm:cache_config_info): the simulator is started with it.
CPU_BLOCK_SIZE = 128
KV_CACHE_GIB = 1
# The tiny chat model's <|im_end|>, its end of sequence (gateway/lobes_engine/tiny_models.py).
EOS_ID = 4


class Server(Protocol):
    """A started engine process: its origin and how to stop it."""

    url: str

    def stop(self) -> None: ...


@dataclass
class Engine:
    """One engine kind's chat and embedding gears and the gateway in front of both."""

    kind: str
    chat: Server
    embed: Server
    gateway: GatewayProcess

    def stop(self) -> None:
        self.gateway.stop()
        self.chat.stop()
        self.embed.stop()


@dataclass(frozen=True)
class Target:
    """Where a test sends its requests: an engine, direct or through its gateway."""

    engine: str
    path: str
    url: str  # chat and models
    embed_url: str
    gear_url: str  # the chat gear itself: its /metrics whatever the path

    @property
    def through_gateway(self) -> bool:
        return self.path == GATEWAY

    def post(self, path: str, body: dict | bytes, timeout: float = 60.0) -> Reply:
        url = self.embed_url if path == "/v1/embeddings" else self.url
        return call(url, "POST", path, body, timeout=timeout)

    def chat(self, timeout: float = 60.0, **body: object) -> Reply:
        payload = {"model": CHAT_NAME, "messages": [{"role": "user", "content": "hello"}],
                   "max_tokens": 8, **body}
        return self.post("/v1/chat/completions", payload, timeout=timeout)

    def metrics(self) -> Scrape:
        return Scrape.of(self.gear_url)


def target(engine: Engine, path: str) -> Target:
    if path == DIRECT:
        return Target(engine.kind, path, engine.chat.url, engine.embed.url, engine.chat.url)
    return Target(engine.kind, path, engine.gateway.url, engine.gateway.url, engine.chat.url)


def gateway_env(chat_url: str, embed_url: str, window: int = WINDOW,
                **extra: str) -> dict[str, str]:
    """A gateway whose cortex role is the chat gear and whose embedder is the embedding gear."""
    return {"PRIMARY_BASE_URL": chat_url, "PRIMARY_SERVED_NAME": CHAT_NAME,
            "PRIMARY_MAX_MODEL_LEN": str(window), "EMBED_BASE_URL": embed_url,
            "EMBED_SERVED_NAME": EMBED_NAME, "GATEWAY_DEFAULT_MODEL": CHAT_NAME, **extra}


def sim_chat(window: int = WINDOW) -> Server:
    """lobes_sim as the tiny chat gear: the minor profile at four times its pace (about
    the tiny model's on the CPU engine), the CPU engine's window and prefix-cache block, and
    the rendered gear's slots and scheduling policy."""
    return start_sim("minor", served_name=CHAT_NAME, time_scale=4, extra_args=[
        "--max-model-len", str(window), "--block-size", str(CPU_BLOCK_SIZE),
        "--max-num-seqs", "4", "--scheduling-policy", "priority"])


def sim_embed() -> Server:
    return start_sim("embedder", served_name=EMBED_NAME, extra_args=[
        "--max-model-len", str(EMBED_WINDOW), "--embed-dim", str(EMBED_DIM)])


def start_sim_engine() -> Engine:
    chat, embed = sim_chat(), sim_embed()
    return Engine(SIM, chat, embed, start_gateway(gateway_env(chat.url, embed.url)))


def cpu_box(install: EngineInstall, port_base: int, window: int = WINDOW,
            max_active: int = 4) -> dict:
    """The plan of a box whose cortex and embedder run on the CPU engine, with the tiny models,
    where scripts/vllm-cpu.sh installed them."""
    hostvars = {
        "fleet_hardware": "sim", "fleet_runtime": "process", "fleet_gear_port_base": port_base,
        "fleet_gateway_host": "127.0.0.1",  # a box of one, answering only its own machine
        "fleet_engine_dir": str(install.engine_dir), "fleet_model_dir": str(install.model_dir),
        "fleet_hf_cache": str(install.engine_dir / "hf-cache"),
        "fleet_roles": {
            "cortex": {"engine": "vllm-cpu", "checkpoint": "lobes/tiny-chat",
                       "served_name": CHAT_NAME, "context": window, "tool_parser": "hermes",
                       "max_active": max_active, "kv_cache_gib": KV_CACHE_GIB},
            "embedder": {"engine": "vllm-cpu", "checkpoint": "lobes/tiny-embed",
                         "served_name": EMBED_NAME, "context": EMBED_WINDOW,
                         "kv_cache_gib": KV_CACHE_GIB},
        },
    }
    return plan_mesh({"box": hostvars})["boxes"]["box"]


def _vllm(install: EngineInstall, role: str, window: int = WINDOW, max_active: int = 4) -> Server:
    """The CPU gear of `role` as the collection renders it, on free ports."""
    plan = cpu_box(install, free_block(16), window, max_active)
    gear = plan["roles"][role]
    return start_vllm(cpu_engine_argv(plan, gear), gear["gear"]["port"],
                      cpu_engine_env(plan, gear))


def vllm_chat(install: EngineInstall, window: int = WINDOW, max_active: int = 4) -> Server:
    return _vllm(install, "cortex", window, max_active)


def vllm_embed(install: EngineInstall) -> Server:
    return _vllm(install, "embedder")


def start_vllm_engine(install: EngineInstall) -> Engine:
    chat, embed = vllm_chat(install), vllm_embed(install)
    return Engine(VLLM_CPU, chat, embed, start_gateway(gateway_env(chat.url, embed.url)))


def error_of(reply: Reply) -> dict:
    """The OpenAI-shaped error object of an answer, with a readable failure when it is not."""
    body = json.loads(reply.body)
    assert isinstance(body.get("error"), dict), body
    return body["error"]
