"""The local store's own walk (bridge/stores/local.py) gives what Store.walk gives over its
listing: the same relative paths in the same order, the same infos, bridge's reserved folder and
its own partial and temporary files left out, links to files followed and links to folders not."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from bridge.names import PARTIAL, TEMPORARY
from bridge.stores.base import ObjectInfo, Store
from bridge.stores.local import LocalStore
from bridge.urls import Location, parse
from tests.helpers import settings_for


def _tree(root: Path) -> None:
    names = ["a-b", "a.b", "a/x", "a0", "a/b/c.txt", "z/_bridge", "_bridge/manifest.json",
             "deep/_bridge/inner", "naïve/名前.txt", "e/" + "n" * 200, "sub dir/with space",
             f"t/f{PARTIAL}1", f"t/g{TEMPORARY}123.host.abcd", "t/kept", "empty/.keep"]
    for i, rel in enumerate(names):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(i))
    (root / "_bridge.txt").write_bytes(b"data, not bridge's")
    (root / "_bridge").mkdir(exist_ok=True)
    (root / "link-to-file").symlink_to(root / "a0")
    (root / "link-to-folder").symlink_to(root / "a", target_is_directory=True)
    (root / "emptydir").mkdir()


def test_sizes_are_the_walks_files(tmp_path):
    """``LocalStore.sizes`` (a pack plan's listing) names the files the walk names, with their sizes."""
    _tree(tmp_path / "src")
    store = LocalStore(settings_for(dict(os.environ)))
    for prefix in (f"{tmp_path}/src/", f"{tmp_path}/src/a/", f"{tmp_path}/src/deep/"):
        root = parse(prefix)
        assert sorted(store.sizes(root)) == sorted((rel, info.size) for rel, info in store.walk(root))
    assert len(list(store.sizes(parse(f"{tmp_path}/src/")))) > 10


def test_the_local_walk_is_store_walk_over_the_listing(tmp_path):
    _tree(tmp_path / "src")
    store = LocalStore(settings_for(dict(os.environ)))
    for prefix in (f"{tmp_path}/src/", f"{tmp_path}/src/a/", f"{tmp_path}/src/deep/"):
        root = parse(prefix)
        fast = list(store.walk(root))
        slow = list(Store.walk(store, root))
        assert fast == slow and (fast or prefix.endswith("/deep/"))   # (deep/ holds bridge's folder alone)
    rels = [rel for rel, _info in store.walk(parse(f"{tmp_path}/src/"))]
    assert "_bridge/manifest.json" not in rels and "deep/_bridge/inner" not in rels
    assert "z/_bridge" in rels and "_bridge.txt" in rels and "link-to-file" in rels
    assert not any(rel.startswith("link-to-folder") or rel.startswith("t/f") or rel.startswith("t/g") for rel in rels)
    # a file named as bridge's folder is reserved at the top only (is_reserved)
    (tmp_path / "top" / "in").mkdir(parents=True)
    (tmp_path / "top" / "_bridge").write_bytes(b"x")
    (tmp_path / "top" / "in" / "_bridge").write_bytes(b"y")
    top = parse(f"{tmp_path}/top/")
    assert [rel for rel, _ in store.walk(top)] == ["in/_bridge"] == [rel for rel, _ in Store.walk(store, top)]
    # a single file, and a folder that is not there, walk as Store.walk walks them
    one = parse(f"{tmp_path}/src/a0")
    assert list(store.walk(one)) == list(Store.walk(store, one))
    assert list(store.walk(parse(f"{tmp_path}/nothing/"))) == []


def test_an_info_made_from_a_listing_is_the_constructors():
    loc = Location("file", "", "tmp/x")
    made = ObjectInfo.listed(loc, 5, {"inode": "1"}, 2.5)
    assert made == ObjectInfo(loc, 5, identity={"inode": "1"}, modified=2.5)
    assert set(vars(made)) == {f.name for f in dataclasses.fields(ObjectInfo)}
    other = ObjectInfo.listed(loc, 5, {}, None)
    other.checksums["crc32c"] = "00000000"
    assert made.checksums == {}   # (each info its own dicts)
