"""Routes (bridge/routes): same-account copies by the stores themselves, counted at a proxy;
fallbacks to direct with their reason; --route on the command line."""

from __future__ import annotations

import json
import os

import pytest

from bridge import ops
from bridge.errors import InvalidOption
from bridge.manifest import read as read_manifest
from bridge.stores import get_store
from bridge.urls import parse
from tests.faultproxy import FaultProxy, proxied_environment
from tests.helpers import make_tree, mcbridge, read_tree, settings_for
from bridge.pipeline import verify as verifying

CLOUDS = ("s3", "gs", "az")


@pytest.fixture(scope="module")
def counting(moto, fake_gcs, azurite, emulator_env):
    """A byte-counting proxy in front of each emulator, and the environment that reaches the
    emulators only through them."""
    proxies = {scheme: FaultProxy(emu.endpoint).start()
               for scheme, emu in (("s3", moto), ("gs", fake_gcs), ("az", azurite))}
    env = proxied_environment(emulator_env, proxies)
    yield proxies, env
    for proxy in proxies.values():
        proxy.stop()


def _data_bytes(proxy: FaultProxy) -> int:
    return proxy.counts["bytes_up"] + proxy.counts["bytes_down"]


@pytest.mark.parametrize("scheme", CLOUDS)
def test_same_account_copy_moves_no_data_through_bridge(scheme, counting, make_root, tmp_path):
    proxies, env = counting
    settings = settings_for(env)
    files = make_tree(tmp_path / "src")
    src, dst = make_root(scheme), make_root(scheme)
    ops.copy(f"{tmp_path / 'src'}/", src, settings, state_dir=tmp_path / "s1")
    proxy = proxies[scheme]
    proxy.configure()                      # counts from zero
    summary = ops.copy(src, dst, settings, state_dir=tmp_path / "s2")
    counts = dict(proxy.counts)            # the copy's own requests, before the checks below read
    payload = sum(len(d) for d in files.values())
    assert summary["route"]["name"] == "server", summary["route"]
    assert summary["route"]["fallbacks"] == {}
    assert read_tree(dst, settings) == files
    assert verifying.verify(dst, settings, deep=True)["ok"]
    entries = read_manifest(get_store(parse(dst), settings), parse(dst)).files
    if scheme == "az":
        # Azure computes no checksum of a blob: nothing proves the copy unread, so it is read back
        # inside the account and hashed. Nothing is sent through bridge; each byte is read once.
        assert summary["route"]["bytes_through_bridge"] == payload
        assert counts["bytes_up"] < payload / 10, (counts, payload)
        assert payload <= counts["bytes_down"] < payload * 1.1, (counts, payload)
        assert all(e.computed == ["crc32c", "sha256"] and e.sha256 and not e.unproven for e in entries.values())
        assert "unproven" not in summary["route"]
    else:
        # Requests, answers and the manifest: a few KiB per file, never the files' bytes.
        assert summary["route"]["bytes_through_bridge"] == 0
        assert counts["bytes_up"] + counts["bytes_down"] < payload / 10, (counts, payload)
        # Only what a store computed is recorded: never the SHA-256 in the source's metadata (a claim).
        assert all(e.computed == [] and e.sha256 == "" for e in entries.values())
        assert all(e.reported["crc32c"] == e.crc32c and not e.unproven for e in entries.values())
    assert verifying.verify(dst, settings)["ok"]


def test_a_same_account_azure_copy_trusted_unread_is_unproven(counting, make_root, tmp_path):
    """store_checksums 'skip' trusts the store's copy instead of reading it back: the record and
    the cheap verify then say nothing proved it, until verify --deep reads it."""
    _proxies, env = counting
    settings = settings_for({**env, "MCBRIDGE_STORE_CHECKSUMS": "skip"})
    files = make_tree(tmp_path / "src")
    src, dst = make_root("az"), make_root("az")
    ops.copy(f"{tmp_path / 'src'}/", src, settings, state_dir=tmp_path / "s1")
    summary = ops.copy(src, dst, settings, state_dir=tmp_path / "s2")
    assert summary["route"]["bytes_through_bridge"] == 0
    entries = read_manifest(get_store(parse(dst), settings), parse(dst)).files
    assert all(e.unproven and e.reported == {} and e.computed == [] for e in entries.values())
    assert sorted(summary["route"]["unproven"]) == sorted(files)
    cheap = verifying.verify(dst, settings)
    assert not cheap["ok"] and cheap["counts"]["unproven"] == len(files), cheap["counts"]
    # A deep read proves them and records so: the cheap verify of those versions then passes.
    r = mcbridge("verify", dst, "--deep", env=env, state_dir=tmp_path / "s3")
    assert r.returncode == 0 and f"{len(files)} unproven before, proven by reading and recorded so" in r.stdout, \
        r.stdout + r.stderr
    entries = read_manifest(get_store(parse(dst), settings), parse(dst)).files
    assert all(not e.unproven and e.note.startswith("proven by reading it") for e in entries.values())
    again = verifying.verify(dst, settings)
    assert again["ok"] and again["counts"]["proven"] == 0, again["counts"]


def test_local_server_copy_uses_the_kernel_and_hashes_the_copy(tmp_path, emulator_env):
    settings = settings_for(emulator_env)
    files = make_tree(tmp_path / "src")
    summary = ops.copy(f"{tmp_path / 'src'}/", f"{tmp_path / 'dst'}/", settings, route="server",
                       state_dir=tmp_path / "s")
    assert summary["route"]["name"] == "server"
    assert summary["route"]["bytes_through_bridge"] == sum(len(d) for d in files.values())  # the hash read
    assert read_tree(f"{tmp_path / 'dst'}/", settings) == files
    assert verifying.verify(f"{tmp_path / 'dst'}/", settings, deep=True)["ok"]
    # between local paths the kernel's copy saves little: direct, unless asked
    again = ops.copy(f"{tmp_path / 'src'}/", f"{tmp_path / 'dst2'}/", settings, state_dir=tmp_path / "s2")
    assert again["route"]["name"] == "direct"


def test_s3_copy_above_the_single_request_limit_goes_in_part_copies(make_root, emulator_env, tmp_path, monkeypatch):
    import dataclasses
    from bridge.stores.s3 import S3Store
    settings = settings_for(emulator_env)
    src, dst = make_root("s3"), make_root("s3")
    data = os.urandom(11 * 1024 * 1024 + 7)
    (tmp_path / "big.bin").write_bytes(data)
    ops.copy(str(tmp_path / "big.bin"), src, settings, state_dir=tmp_path / "s1")
    store = get_store(parse(src), settings)
    # moto keeps objects in memory: lower the 5 GiB CopyObject limit instead of copying 5 GiB
    monkeypatch.setattr(S3Store, "features", dataclasses.replace(S3Store.features, max_copy_size=5 * 1024 * 1024))
    info = store.copy_object(parse(src).join("big.bin"), parse(dst).join("big.bin"), size=len(data))
    assert store.read(parse(dst).join("big.bin")) == data
    assert info.checksums["crc32c"] == store.info(parse(src).join("big.bin")).checksums["crc32c"]


def test_forced_route_that_cannot_serve_is_bad_input(make_root, emulator_env, tmp_path):
    settings = settings_for(emulator_env)
    src, dst = make_root("s3"), make_root("gs")
    (tmp_path / "f").write_bytes(b"x")
    ops.copy(str(tmp_path / "f"), src, settings, state_dir=tmp_path / "s")
    with pytest.raises(InvalidOption, match="--route server cannot copy"):
        ops.copy(src, dst, settings, route="server")
    with pytest.raises(InvalidOption, match="unknown route"):
        ops.copy(src, dst, settings, route="teleport")
    r = mcbridge("cp", src, dst, "--route", "server", env=emulator_env, state_dir=tmp_path / "st")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "one store account" in r.stderr


def test_route_direct_works_everywhere_and_json_says_so(make_root, emulator_env, tmp_path):
    src, dst = make_root("gs"), make_root("gs")
    (tmp_path / "f").write_bytes(b"hello")
    assert mcbridge("cp", str(tmp_path / "f"), src, env=emulator_env, state_dir=tmp_path / "st").returncode == 0
    r = mcbridge("cp", src, dst, "--route", "direct", "--json", env=emulator_env, state_dir=tmp_path / "st")
    assert r.returncode == 0, r.stderr
    route = json.loads(r.stdout)["route"]
    assert route["name"] == "direct" and route["why"] == "forced with --route"
    assert route["bytes_through_bridge"] == 5
    r = mcbridge("cp", src, make_root("gs"), "--json", env=emulator_env, state_dir=tmp_path / "st")
    assert json.loads(r.stdout)["route"]["name"] == "server"


@pytest.fixture(scope="module")
def pulled(moto, fake_gcs, azure_from_url, emulator_env):
    """Counting proxies in front of moto and fake-gcs (the sources Azure reads) and in front of
    the Put Block From URL double (what bridge sends to Azure)."""
    proxies = {"s3": FaultProxy(moto.endpoint).start(), "gs": FaultProxy(fake_gcs.endpoint).start(),
               "az": FaultProxy(azure_from_url.endpoint.rsplit("/", 1)[0]).start()}
    env = proxied_environment(emulator_env, proxies)
    yield proxies, env, azure_from_url
    for proxy in proxies.values():
        proxy.stop()


@pytest.mark.parametrize("scheme", ("s3", "gs"))
def test_from_url_into_azure_moves_no_data_through_bridge(scheme, pulled, make_root, tmp_path):
    proxies, env, double = pulled
    settings = settings_for(env, chunk_size=4 * 1024 * 1024)
    files = make_tree(tmp_path / "src")
    src, dst = make_root(scheme), make_root("az")
    ops.copy(f"{tmp_path / 'src'}/", src, settings, state_dir=tmp_path / "s1")
    for proxy in proxies.values():
        proxy.configure()
    fetched = double.counts["fetched_bytes"]
    summary = ops.copy(src, dst, settings, state_dir=tmp_path / "s2")
    payload = sum(len(d) for d in files.values())
    # An S3 multipart upload has no MD5 its store computed: Azure could check nothing of a pull,
    # so bridge, choosing the route itself, sends that file direct and hashes it as it passes.
    direct = ["big/weights.bin"] if scheme == "s3" else []
    through = sum(len(files[rel]) for rel in direct)
    route = summary["route"]
    assert route["name"] == "from-url" and sorted(route["fallbacks"]) == direct, route
    assert all("computed no MD5 of it" in why for why in route["fallbacks"].values()), route
    assert route["bytes_through_bridge"] == through
    assert double.counts["fetched_bytes"] - fetched == payload - through  # Azure read the rest once ...
    source_side = _data_bytes(proxies[scheme])
    assert payload <= source_side < payload + 200_000                    # ... each byte read once in all
    assert _data_bytes(proxies["az"]) < through + payload / 10           # bridge sent Azure requests only
    assert read_tree(dst, settings) == files
    assert verifying.verify(dst, settings)["ok"]                               # every file proven
    assert verifying.verify(dst, settings, deep=True)["ok"]
    entries = read_manifest(get_store(parse(dst), settings), parse(dst)).files
    assert all(e.computed == [] and "Put Block From URL" in e.note and not e.unproven
               for rel, e in entries.items() if e.size and rel not in direct)
    assert all(entries[rel].computed for rel in direct)
    if scheme == "s3":
        # Forced, the route pulls it anyway, and its record and verify say nothing proved it.
        dst2 = make_root("az")
        forced = ops.copy(src, dst2, settings, route="from-url", state_dir=tmp_path / "s3")
        assert forced["route"]["fallbacks"] == {} and sorted(forced["route"]["unproven"]) == direct
        report = verifying.verify(dst2, settings)
        assert [row["path"] for row in report["unproven"]] == direct and not report["ok"], report
        assert verifying.verify(dst2, settings, deep=True)["ok"]


def test_from_url_falls_back_to_direct_where_azure_cannot_pull(make_root, emulator_env, tmp_path):
    """Plain Azurite answers Put Block From URL 'not implemented': the first refusal sends the
    job direct, and the summary says why."""
    settings = settings_for(emulator_env)
    files = make_tree(tmp_path / "src")
    src, dst = make_root("s3"), make_root("az")
    ops.copy(f"{tmp_path / 'src'}/", src, settings, state_dir=tmp_path / "s1")
    summary = ops.copy(src, dst, settings, state_dir=tmp_path / "s2")
    route = summary["route"]
    # an empty file needs no block: it may be written before the first refusal
    assert route["name"] == "from-url" and set(files) - {"empty.txt"} <= set(route["fallbacks"])
    # (a multipart source is sent direct before any pull: Azure could check nothing of it)
    assert all("does not implement Put Block From URL" in why or "computed no MD5 of it" in why
               for why in route["fallbacks"].values()), route["fallbacks"]
    assert any("does not implement Put Block From URL" in why for why in route["fallbacks"].values())
    assert route["bytes_through_bridge"] == sum(len(d) for d in files.values())
    assert read_tree(dst, settings) == files
    assert verifying.verify(dst, settings, deep=True)["ok"]


def test_route_table_refuses_what_a_cloud_cannot_pull(make_root, emulator_env, tmp_path):
    settings = settings_for(emulator_env)
    src = make_root("az")
    (tmp_path / "f").write_bytes(b"x")
    ops.copy(str(tmp_path / "f"), src, settings, state_dir=tmp_path / "s")
    with pytest.raises(InvalidOption, match="only Azure pulls from a URL"):
        ops.copy(src, make_root("s3"), settings, route="from-url")
    summary = ops.copy(src, make_root("s3"), settings, state_dir=tmp_path / "s2")
    assert summary["route"]["name"] == "direct" and "from-url" in summary["route"]["why"]


def test_azure_copy_above_the_synchronous_limit_goes_in_blocks_committed_at_once(azure_from_url, make_root,
                                                                                  emulator_env, tmp_path,
                                                                                  monkeypatch):
    """Above 256 MiB (lowered here to 1 MiB, the blocks to 1 MiB) a same-account copy stages its
    blocks from the source's URL (Put Block From URL, the double in front of Azurite) and commits
    them in one Put Block List, the source's metadata kept. Plain Azurite has no Put Block From
    URL: the store says so (Unsupported), which sends a server route's job direct."""
    import bridge.stores.azure as azure
    from bridge.errors import Unsupported
    settings = settings_for({**emulator_env, "AZURE_STORAGE_CONNECTION_STRING": azure_from_url.connection_string()})
    src, dst = make_root("az"), make_root("az")
    data = os.urandom(3 * 1024 * 1024 + 1)
    (tmp_path / "big.bin").write_bytes(data)
    ops.copy(str(tmp_path / "big.bin"), src, settings, state_dir=tmp_path / "s1")
    monkeypatch.setattr(azure, "SYNC_COPY_MAX", 1024 * 1024)
    monkeypatch.setattr(azure, "COPY_BLOCK", 1024 * 1024)
    store = get_store(parse(src), settings)
    staged = azure_from_url.counts["blocks_from_url"]
    info = store.copy_object(parse(src).join("big.bin"), parse(dst).join("big.bin"), size=len(data))
    assert azure_from_url.counts["blocks_from_url"] - staged == 4
    assert info.size == len(data) and store.read(parse(dst).join("big.bin")) == data
    assert info.metadata["bridge_crc32c"] == store.info(parse(src).join("big.bin")).metadata["bridge_crc32c"]
    plain = get_store(parse(src), settings_for(emulator_env))
    with pytest.raises(Unsupported):
        plain.copy_object(parse(src).join("big.bin"), parse(dst).join("again.bin"), size=len(data))
    assert [i.location.key for i in plain.list(parse(dst))] == ["big.bin"]   # nothing left by the refused copy


def test_sync_by_server_sends_only_what_changed_and_deletes(make_root, emulator_env, tmp_path):
    settings = settings_for(emulator_env)
    src, dst = make_root("s3"), make_root("s3")
    store = get_store(parse(src), settings)
    from bridge.hashing import crc32c, crc_hex
    for rel, data in {"a.txt": b"one", "b.txt": b"two", "c.txt": b"three"}.items():
        store.put(parse(src).join(rel), data, crc32c=crc_hex(crc32c(data)), metadata={})
    first = ops.sync(src, dst, settings, state_dir=tmp_path / "s1")
    assert first["route"]["name"] == "server" and sorted(first["sent"]) == ["a.txt", "b.txt", "c.txt"]
    store.put(parse(src).join("b.txt"), b"TWO!", crc32c=crc_hex(crc32c(b"TWO!")), metadata={})
    store.delete(parse(src).join("c.txt"))
    again = ops.sync(src, dst, settings, delete=True, state_dir=tmp_path / "s2")
    assert again["sent"] == ["b.txt"] and again["deleted"] == ["c.txt"]
    assert again["route"]["bytes_through_bridge"] == 0
    assert read_tree(dst, settings) == {"a.txt": b"one", "b.txt": b"TWO!"}
    assert verifying.verify(dst, settings, deep=True)["ok"]


def test_dry_run_names_the_route(make_root, emulator_env, tmp_path):
    src, dst = make_root("az"), make_root("az")
    (tmp_path / "f").write_bytes(b"x" * 10)
    assert mcbridge("cp", str(tmp_path / "f"), src, env=emulator_env, state_dir=tmp_path / "st").returncode == 0
    r = mcbridge("cp", src, dst, "--dry-run", env=emulator_env, state_dir=tmp_path / "st")
    assert r.returncode == 0 and "route server: source and destination are in one store account" in r.stdout
    plan = json.loads(mcbridge("cp", src, dst, "--dry-run", "--json", "--route", "direct", env=emulator_env,
                               state_dir=tmp_path / "st").stdout)
    assert plan["route"] == {"name": "direct", "why": "forced with --route"}


def test_server_copy_on_an_endpoint_without_checksums_hashes_the_copy(tmp_path):
    """rclone serve s3 keeps no S3 checksums, and an object another tool wrote carries no bridge
    metadata: the copy is read back to be hashed, and its entry says so."""
    from tests.emulators import RcloneS3, environment_for
    with RcloneS3() as endpoint:
        endpoint.create_bucket("src-bkt")
        endpoint.create_bucket("dst-bkt")
        settings = settings_for(environment_for([endpoint]))
        data = os.urandom(300_000)
        endpoint.client().put_object(Bucket="src-bkt", Key="f.bin", Body=data)   # no bridge metadata
        summary = ops.copy("s3://src-bkt/", "s3://dst-bkt/", settings, state_dir=tmp_path / "s2")
        assert summary["route"]["name"] == "server" and summary["route"]["bytes_through_bridge"] == len(data)
        store = get_store(parse("s3://dst-bkt/"), settings)
        entry = read_manifest(store, parse("s3://dst-bkt/")).files["f.bin"]
        assert entry.computed == ["crc32c", "sha256"] and "reports no CRC32C" in entry.note
        assert store.read(parse("s3://dst-bkt/f.bin")) == data
        assert verifying.verify("s3://dst-bkt/", settings, deep=True)["ok"]


def test_from_url_whose_source_azure_cannot_read_falls_back_with_the_reason(pulled, make_root, tmp_path):
    """The source answers Azure's fetch 403 (as an expired or foreign URL would): the double
    answers CannotVerifyCopySource, and the job goes direct, saying why."""
    from tests.faultproxy import Rule
    proxies, env, double = pulled
    settings = settings_for(env)
    files = make_tree(tmp_path / "src")
    src, dst = make_root("gs"), make_root("az")
    ops.copy(f"{tmp_path / 'src'}/", src, settings, state_dir=tmp_path / "s1")
    proxies["gs"].configure(rules=[Rule(r"^GET /download/", "reply", times=1000, reply=(403, {}, b"denied"))])
    try:
        summary = ops.copy(src, dst, settings, state_dir=tmp_path / "s2")
    finally:
        proxies["gs"].configure()
    route = summary["route"]
    assert route["name"] == "from-url" and set(files) - {"empty.txt"} <= set(route["fallbacks"])
    assert any("Azure could not read the source URL" in why for why in route["fallbacks"].values())
    assert read_tree(dst, settings) == files
    assert verifying.verify(dst, settings, deep=True)["ok"]
    assert not list(get_store(parse(dst), settings).list_uploads(parse(dst))), "staged blocks were discarded"
