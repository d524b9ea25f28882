"""Fixtures for the whole suite; the emulators themselves live in tests/emulators.py.

Each emulator starts once per session, and only when a test first asks for it. Tests are kept
apart by fresh buckets with unique names rather than by resetting the emulators between tests.

    make_root("local") -> "/tmp/.../t-1a2b3c4d/"   a new empty directory
    make_root("s3")    -> "s3://t-1a2b3c4d/"       a new bucket on moto
    make_root("gs")    -> "gs://t-1a2b3c4d/"       a new bucket on fake-gcs-server
    make_root("az")    -> "az://t-1a2b3c4d/"       a new container on Azurite
    emulator_for("s3") -> the session's MotoServer (FakeGCS for "gs", Azurite for "az")
    store_root         -> one of those per test, parametrized over SCHEMES (the shared store suite)
    env_for("s3", ...) -> os.environ plus those emulators' variables, as a new dict for subprocesses
    emulator_env       -> the same for all three emulators
    azure_from_url     -> Put Block From URL in front of Azurite (tests/doubles/azure_from_url.py)
    redis_url          -> "redis://127.0.0.1:PORT/15"

os.environ is never changed: pass ``env=`` to subprocesses, or configure clients explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.emulators import (
    SCHEMES,
    Azurite,
    Emulator,
    FakeGCS,
    MotoServer,
    Redis,
    environment_for,
    unique_name,
)

EMULATOR_FIXTURES = {
    MotoServer.scheme: "moto",
    FakeGCS.scheme: "fake_gcs",
    Azurite.scheme: "azurite",
}


@pytest.fixture(scope="session")
def moto() -> Iterator[MotoServer]:
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGCS]:
    with FakeGCS() as server:
        yield server


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    with Azurite() as server:
        yield server


@pytest.fixture(scope="session")
def azure_from_url(azurite):
    """Azure Put Block From URL in front of Azurite (tests/doubles/azure_from_url.py); its
    ``connection_string()`` reaches Azurite through it."""
    from tests.doubles.azure_from_url import AzureFromUrl
    from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY
    with AzureFromUrl(azurite.endpoint, AZURITE_ACCOUNT, AZURITE_KEY) as double:
        yield double


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with Redis() as redis:
        yield redis.url


@pytest.fixture(scope="session")
def emulator_env(moto: MotoServer, fake_gcs: FakeGCS, azurite: Azurite) -> dict[str, str]:
    """os.environ plus every emulator's variables; shared by the session: copy before changing."""
    return environment_for([moto, fake_gcs, azurite])


@pytest.fixture
def emulator_for(request: pytest.FixtureRequest) -> Callable[[str], Emulator]:
    """``emulator_for("s3")``: the session's emulator for that scheme, started on first use."""

    def find(scheme: str) -> Emulator:
        if scheme not in EMULATOR_FIXTURES:
            raise ValueError(f"no emulator for {scheme!r}; known: {sorted(EMULATOR_FIXTURES)}")
        return request.getfixturevalue(EMULATOR_FIXTURES[scheme])

    return find


@pytest.fixture
def env_for(emulator_for: Callable[[str], Emulator]) -> Callable[..., dict[str, str]]:
    """``env_for("s3", "az")``: a new dict of os.environ plus those emulators' variables only."""

    def build(*schemes: str) -> dict[str, str]:
        return environment_for(emulator_for(scheme) for scheme in schemes)

    return build


@pytest.fixture
def make_root(emulator_for: Callable[[str], Emulator], tmp_path: Path) -> Callable[[str], str]:
    """``make_root(scheme)``: the URL of a new, empty root on that store, ending with "/"."""

    def make(scheme: str) -> str:
        name = unique_name()
        if scheme == "local":
            directory = tmp_path / name
            directory.mkdir()
            return f"{directory.as_posix()}/"
        emulator_for(scheme).create_bucket(name)
        return f"{scheme}://{name}/"

    return make


@pytest.fixture(params=SCHEMES)
def store_root(request: pytest.FixtureRequest, make_root: Callable[[str], str]) -> str:
    """A new, empty root on each store in turn: a test using it runs once per scheme."""
    return make_root(request.param)
