"""The event loop of the small-object batches (bridge.stores.streams.new_loop): uvloop's where it
is installed, asyncio's when ``$MCBRIDGE_EVENT_LOOP`` asks for it; the same requests either way."""

from __future__ import annotations

import os

import pytest

from bridge import ops
from bridge.stores import streams
from tests.emulators import unique_name
from tests.helpers import mcbridge, settings_for

FILES = 40


@pytest.fixture
def fresh_homes():
    """This process's event loops closed before and after, so that the test's are made anew."""
    streams._close_homes()
    yield
    streams._close_homes()


@pytest.mark.parametrize("choice, module", [("", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_small_files_go_up_and_down_on_the_chosen_loop(moto, tmp_path, monkeypatch, fresh_homes, choice, module):
    monkeypatch.setenv("MCBRIDGE_EVENT_LOOP", choice)
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(FILES):
        (src / f"{i:03d}.bin").write_bytes(os.urandom(3000 + i))
    settings = settings_for({**moto.env(), "MCBRIDGE_STATE_DIR": str(tmp_path / "state")})
    assert ops.copy(f"{src}/", f"s3://{bucket}/p/", settings)["ok"]
    assert ops.copy(f"s3://{bucket}/p/", f"{tmp_path / 'back'}/", settings)["ok"]
    for i in range(FILES):
        assert (tmp_path / "back" / f"{i:03d}.bin").read_bytes() == (src / f"{i:03d}.bin").read_bytes()
    loops = {type(home.loop).__module__.split(".")[0] for home in streams._homes}
    assert loops == {module}, loops


def test_an_unknown_event_loop_is_refused_in_one_line_and_nothing_is_written(moto, tmp_path):
    bucket = unique_name()
    moto.create_bucket(bucket)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.bin").write_bytes(b"x" * 100)
    run = mcbridge("cp", f"{src}/", f"s3://{bucket}/p/", env={**moto.env(), "MCBRIDGE_EVENT_LOOP": "tokio"},
                   state_dir=tmp_path / "state")
    assert run.returncode != 0
    assert "MCBRIDGE_EVENT_LOOP='tokio': use uvloop or asyncio" in run.stderr
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    # refused before any request of the batch: no object, and no record
    assert moto.client().list_objects_v2(Bucket=bucket).get("Contents", []) == []
