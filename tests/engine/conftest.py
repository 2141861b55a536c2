"""The `engine` tier's servers: real SGLang 0.5.23 on the CPU backend (tests/engine/engine.py), started
once for this package and shared by every test of the tier (each start costs ~25 s of a 2-core machine);
package scope stops them as soon as the tier's last test ends, not at the end of the whole suite.

    engine_fleet.colloc     collocated, page size 16, chat template in tokenizer_config.json, KV events
    engine_fleet.colloc_p1  collocated, page size 1, chat template in chat_template.jinja, KV events
    engine_fleet.prefill    PD prefill (Mooncake over TCP), page size 16, chat_template.jinja, KV events,
                            --enable-pd-role-switch
    engine_fleet.decode     PD decode

The collocated pair is its own fixture (`engine_colloc`), which the fleet reuses: a module that needs only
those two starts no PD pair.

Tests that change a server (flush, restart) put it back as they found it. Every test here is marked
`engine` and `slow`; without the environment they skip naming the command that installs it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.engine import engine, tiny_model


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.engine)
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                # the session's servers start inside the first test's time (~1 min on an idle 2-core machine)
                item.add_marker(pytest.mark.timeout(600))


@pytest.fixture(scope="package")
def engine_python() -> Path:
    py = engine.python()
    if py is None:
        pytest.skip(f"real SGLang 0.5.23 (CPU) not installed at {engine.VENV}: {engine.INSTALL_CMD}")
    return py


@dataclass
class Models:
    config: str  # chat template inside tokenizer_config.json
    jinja: str   # chat template in chat_template.jinja


@pytest.fixture(scope="package")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    root = tmp_path_factory.mktemp("tiny-models")
    return Models(config=tiny_model.write(str(root / "config-layout")),
                  jinja=tiny_model.write(str(root / "jinja-layout"), template_file=True))


@dataclass
class Fleet:
    colloc: engine.EngineServer
    colloc_p1: engine.EngineServer
    prefill: engine.EngineServer
    decode: engine.EngineServer
    models: Models

    @property
    def all(self) -> list[engine.EngineServer]:
        return [self.colloc, self.colloc_p1, self.prefill, self.decode]


@dataclass
class Colloc:
    colloc: engine.EngineServer
    colloc_p1: engine.EngineServer


@pytest.fixture(scope="package")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="package")
def engine_colloc(engine_python: Path, tiny_models: Models, engine_logs: Path) -> Iterator[Colloc]:
    """The two collocated servers alone: a test module that needs no PD pair (the differential test)
    starts 2 servers, not 4, on a 2-core machine."""
    pair = Colloc(
        colloc=engine.EngineServer("colloc", tiny_models.config, engine_logs, page_size=16, kv_events=True),
        colloc_p1=engine.EngineServer("colloc-p1", tiny_models.jinja, engine_logs, page_size=1, kv_events=True),
    )
    engine.start_all([pair.colloc, pair.colloc_p1])
    yield pair
    for s in (pair.colloc, pair.colloc_p1):
        s.stop()


@pytest.fixture(scope="package")
def engine_fleet(engine_colloc: Colloc, tiny_models: Models, engine_logs: Path) -> Iterator[Fleet]:
    fleet = Fleet(
        colloc=engine_colloc.colloc,
        colloc_p1=engine_colloc.colloc_p1,
        # --enable-pd-role-switch: tests/engine/test_role_switch_engine.py asks it (prepare-only and refusals:
        # nothing switches, the other tests see a plain prefill)
        prefill=engine.EngineServer("prefill", tiny_models.jinja, engine_logs, mode="prefill", kv_events=True,
                                    extra=["--enable-pd-role-switch"]),
        decode=engine.EngineServer("decode", tiny_models.jinja, engine_logs, mode="decode"),
        models=tiny_models,
    )
    engine.start_all([fleet.prefill, fleet.decode])
    yield fleet
    for s in (fleet.prefill, fleet.decode):
        s.stop()
