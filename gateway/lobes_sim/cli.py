"""Command line: ``python3 -m lobes_sim --profile NAME --port P [...]``."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import math
import resource
import signal
from collections.abc import Sequence

from lobes_contract import SIM_ENGINE_VERSION

from .faults import Faults
from .memory import holding
from .profiles import AUDIO, EMBED, GENERATE, PROFILES, SCORE, Profile
from .server import GENERATE_ROUTES, AdminPort, ServingPort, serving_routes
from .state import SimState

# Long enough for every stream to write its end once the engine died.
SHUTDOWN_FLUSH_S = 0.1
DESCRIPTION = """\
A vLLM OpenAI-server stand-in for machines without a GPU. It serves /health, /v1/models,
/metrics and the profile's task (chat and text completions, embeddings, rerank/score, or the
audio bridge) with continuous batching: --max-num-seqs running slots, a waiting queue, and
per-step decode time that grows with the batch. Profiles are calibrated against measured boxes.
Faults can be set at start (--fault-*) or at run time: POST /admin/faults on --admin-port.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m lobes_sim",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="serving port (0: pick a free one)")
    parser.add_argument(
        "--profile", default="instant", choices=sorted(PROFILES),
        help="calibrated gear to simulate; supplies defaults for every option below",
    )
    parser.add_argument("--served-name", help="model id to serve (default: the profile's)")
    parser.add_argument("--max-model-len", type=int, help="context window in tokens")
    parser.add_argument(
        "--model", metavar="PATH",
        help="what /v1/models names as the model's root, as vLLM's --model (default: the "
             "served name)")
    parser.add_argument(
        "--engine-version", default=SIM_ENGINE_VERSION,
        help=f"the version /version reports (default {SIM_ENGINE_VERSION}, the build the "
             "simulator stands in for; another one makes a gear whose engine is skewed)")
    parser.add_argument("--max-num-seqs", type=int, help="running slots of the engine")
    parser.add_argument(
        "--scheduling-policy", choices=("fcfs", "priority"),
        help="vLLM's scheduling policy: fcfs (default; a request's priority is accepted and "
             "ignored) or priority (waiting requests by their priority field, lower first)",
    )
    parser.add_argument(
        "--block-size", type=int,
        help="vLLM's --block-size: the prefix cache's block, in tokens (default 16, a GPU "
             "build's; vLLM's CPU build uses 128)",
    )
    parser.add_argument(
        "--tokens-per-chunk", type=int,
        help="output tokens per streamed chunk, as a gear with speculative decoding (MTP) "
             "sends them (default 1; the engine's timing is unchanged)",
    )
    parser.add_argument(
        "--prefill-scale", type=non_negative, default=1.0, metavar="FACTOR",
        help="multiply the profile's prefill time by FACTOR (default 1; 0: prefill costs "
             "nothing, a bound on what prefix caching can save)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0,
        help="run the same schedule this many times faster (default 1: real time)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of all generated output")
    parser.add_argument("--embed-dim", type=int, help="embedding dimension (embedder profile)")
    parser.add_argument("--quantization", help="quantization the gear reports (admin GET /health)")
    parser.add_argument("--chars-per-token", type=int,
                        help="characters of text a prompt token stands for (default 4)")
    parser.add_argument(
        "--admin-port", type=int, default=0,
        help="port of the admin API (faults, request recorder); 0 picks a free one",
    )
    faults = parser.add_argument_group("faults (also settable at run time: POST /admin/faults)")
    faults.add_argument("--fault-refuse", action="store_true",
                        help="do not listen on the serving port (connection refused)")
    faults.add_argument("--fault-status", type=int, default=0, metavar="STATUS",
                        help="answer every serving request with this 5xx status")
    faults.add_argument("--fault-hang", action="store_true",
                        help="accept each request and never send a byte")
    faults.add_argument("--fault-hang-s", type=float, default=0.0, metavar="SECONDS",
                        help="wait this many simulated seconds before the first byte")
    faults.add_argument("--fault-die-after-chunks", type=int, default=0, metavar="N",
                        help="close the socket after N SSE chunks of every stream")
    faults.add_argument("--fault-die-mid-body", action="store_true",
                        help="send a POST's JSON answer head and half its body, then close")
    faults.add_argument("--fault-slow", type=float, default=1.0, metavar="FACTOR",
                        help="make every engine step FACTOR times longer")
    faults.add_argument("--fault-reject-strict-tools", action="store_true",
                        help="answer chat requests whose tools carry strict: true with vLLM's "
                             "400 for a schema that does not compile")
    memory = parser.add_argument_group("unified memory (tests of a box's memory)")
    memory.add_argument("--proc-root", help="directory of a fake meminfo this gear holds its "
                                            "share of while it runs")
    memory.add_argument("--hold-memory-gib", type=float, default=0.0, metavar="GIB",
                        help="the share held: taken off MemAvailable at start, given back at exit")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level")
    return parser


def non_negative(text: str) -> float:
    """A float of 0 or more (argparse type)."""
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number >= 0")
    return value


def profile_from_args(args: argparse.Namespace) -> Profile:
    """The chosen profile with the command line's overrides applied."""
    return PROFILES[args.profile].with_prefill_scale(args.prefill_scale).with_overrides(
        served_name=args.served_name,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        scheduling_policy=args.scheduling_policy,
        tokens_per_chunk=args.tokens_per_chunk,
        block_size=args.block_size,
        embed_dim=args.embed_dim,
        quantization=args.quantization,
        chars_per_token=args.chars_per_token,
    )


def faults_from_args(args: argparse.Namespace) -> Faults:
    return Faults(
        refuse=args.fault_refuse,
        error_status=args.fault_status,
        hang=args.fault_hang,
        hang_s=args.fault_hang_s,
        die_after_chunks=args.fault_die_after_chunks,
        die_mid_body=args.fault_die_mid_body,
        slow_factor=args.fault_slow,
        reject_strict_tools=args.fault_reject_strict_tools,
    )


def task_routes(task: str) -> dict:
    """The serving routes of the profile's task (imported lazily: each task its own module)."""
    if task == GENERATE:
        return GENERATE_ROUTES
    if task in (EMBED, SCORE):
        from .pooling import EMBED_ROUTES, SCORE_ROUTES

        return EMBED_ROUTES if task == EMBED else SCORE_ROUTES
    if task == AUDIO:
        from .audio import AUDIO_ROUTES

        return AUDIO_ROUTES
    raise ValueError(f"profile task {task!r} has no routes")


def raise_open_file_limit() -> None:
    """Thousands of held streams need thousands of sockets: lift the soft limit to the hard."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def serve(args: argparse.Namespace) -> None:
    """Start both listeners and the engine; run until SIGTERM or SIGINT."""
    state = SimState(profile_from_args(args), args.time_scale, args.seed, faults_from_args(args),
                     engine_version=args.engine_version, model_root=args.model)
    serving = ServingPort(state, serving_routes(task_routes(state.profile.task)),
                          args.host, args.port)
    await serving.apply_refuse(state.faults.refuse)
    admin = AdminPort(state, serving, args.host, args.admin_port)
    await admin.start()
    engine_task = asyncio.create_task(state.engine.run())
    # Start-up objects live for the whole run; freezing them keeps GC pauses short.
    gc.freeze()
    print(f"lobes_sim {state.profile.name} serving {state.profile.served_name} on "
          f"{args.host}:{serving.port} admin {admin.port}", flush=True)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, state.shutdown.set)
    await state.shutdown.wait()
    # As vLLM's server shuts down (mode abort, no grace): every request ends at once, each
    # stream with an error event and [DONE], before the process exits.
    state.engine.die()
    await asyncio.sleep(SHUTDOWN_FLUSH_S)
    engine_task.cancel()


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.time_scale <= 0:
        parser.error("--time-scale must be positive")
    if args.block_size is not None and args.block_size < 1:
        parser.error("--block-size must be at least 1")
    logging.basicConfig(level=args.log_level.upper())
    raise_open_file_limit()
    with holding(args.proc_root, args.hold_memory_gib):
        asyncio.run(serve(args))
