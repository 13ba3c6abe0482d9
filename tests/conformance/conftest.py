"""Fixtures of the conformance suite: each engine once per session (the CPU engine takes half
a minute to start and busy-polls a core), each test run direct and through a gateway.

Tests of the real engine carry the `engine` mark: scripts/test.sh runs them on their own,
after the parallel run, so no other test competes with the engine for the two cores.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conformance.servers import (
    DIRECT,
    GATEWAY,
    SIM,
    VLLM_CPU,
    Engine,
    Target,
    start_sim_engine,
    start_vllm_engine,
    target,
)
from tests.support.vllm_proc import EngineInstall, engine_install


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that starts a real engine (by its parameter) is marked `engine`."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("engine_kind") == VLLM_CPU:
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def install() -> EngineInstall:
    """The engine's venv and the tiny models (scripts/vllm-cpu.sh builds what is missing)."""
    return engine_install()


@pytest.fixture(scope="session")
def sim_engine() -> Iterator[Engine]:
    engine = start_sim_engine()
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def vllm_engine(install: EngineInstall) -> Iterator[Engine]:
    engine = start_vllm_engine(install)
    yield engine
    engine.stop()


@pytest.fixture(scope="session", params=[SIM, VLLM_CPU])
def engine_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def engine(engine_kind: str, request: pytest.FixtureRequest) -> Engine:
    return request.getfixturevalue("sim_engine" if engine_kind == SIM else "vllm_engine")


@pytest.fixture(params=[DIRECT, GATEWAY])
def server(engine: Engine, request: pytest.FixtureRequest) -> Target:
    """The engine, direct and through its gateway."""
    return target(engine, request.param)


@pytest.fixture
def gear(engine: Engine) -> Target:
    """The engine direct: for the surfaces only an engine has (/health, /version, /metrics)."""
    return target(engine, DIRECT)
