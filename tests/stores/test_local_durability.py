"""A local file is on disk before its name points at it, and the rename itself is made durable.

Power loss cannot be simulated here, so this watches the real system calls of a real process with
strace: the file is fsync'ed before the rename into place, its directory after."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from bridge.errors import BridgeError
from bridge.hashing import crc32c, crc_hex
from bridge.stores import get_store
from bridge.urls import parse
from tests.helpers import settings_for

SCRIPT = textwrap.dedent("""
    import sys
    from bridge.config import load_settings
    from bridge.hashing import crc32c, crc_hex
    from bridge.stores import get_store
    from bridge.urls import parse
    root = sys.argv[1]
    store = get_store("file", load_settings(environ={"XDG_CONFIG_HOME": "/nonexistent"}))
    data = b"x" * 1000
    store.put(parse(root + "whole/one.bin"), data, crc32c=crc_hex(crc32c(data)), metadata={})
    loc = parse(root + "parts/two.bin")
    upload = store.begin_upload(loc, 2000)
    parts = [store.upload_part(loc, upload, n, (n - 1) * 1000, data, crc_hex(crc32c(data))) for n in (1, 2)]
    store.complete_upload(loc, upload, parts, crc32c="", metadata={})
""")


def _calls(log: str) -> list[tuple[str, str]]:
    """(call, path) for fsync and rename lines of ``strace -y`` output, in order."""
    out = []
    for line in log.splitlines():
        if m := re.search(r"\bf(?:data)?sync\(\d+<([^>]*)>\)\s+=\s+0", line):
            out.append(("fsync", m.group(1)))
        elif m := re.search(r"\brename(?:at2?)?\((?:[^,]*, )?\"([^\"]+)\", (?:[^,]*, )?\"([^\"]+)\"", line):
            out.append(("rename", m.group(2)))
    return out


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_put_and_complete_fsync_the_file_then_the_directory(tmp_path):
    root = tmp_path / "dst"
    root.mkdir()
    log = tmp_path / "strace.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run(["strace", "-f", "-y", "-o", str(log), "-e", "trace=fsync,fdatasync,rename,renameat,renameat2",
                        sys.executable, "-c", SCRIPT, f"{root}/"], env=env, capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0 and "ptrace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    calls = _calls(log.read_text())
    for final in (root / "whole/one.bin", root / "parts/two.bin"):
        renamed = [i for i, (call, path) in enumerate(calls) if call == "rename" and path == str(final)]
        assert len(renamed) == 1, calls
        i = renamed[0]
        assert any(call == "fsync" and path.startswith(f"{final}.") for call, path in calls[:i]), \
            f"{final}: no fsync of the file before it was renamed into place: {calls}"
        assert ("fsync", str(final.parent)) in calls[i + 1:], f"{final.parent}: not fsync'ed after the rename: {calls}"
    assert sorted(p.name for p in (root / "whole").iterdir()) == ["one.bin"], "no temporary left"
    assert sorted(p.name for p in (root / "parts").iterdir()) == ["two.bin"], "no partial or sidecar left"
    assert (root / "parts/two.bin").read_bytes() == b"x" * 2000


def test_a_failed_put_leaves_neither_temporary_nor_object(tmp_path, emulator_env):
    store = get_store(parse(f"{tmp_path}/"), settings_for(emulator_env))
    (tmp_path / "blocked").write_bytes(b"a file where a directory is needed")
    with pytest.raises(BridgeError):
        store.put(parse(f"{tmp_path}/blocked/x.bin"), b"data", crc32c=crc_hex(crc32c(b"data")), metadata={})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked"]
