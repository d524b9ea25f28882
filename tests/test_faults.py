"""Transient means retried, everywhere: copies through a fault-injecting proxy (tests/faultproxy.py)
in front of each emulator, which answers some requests 503 and cuts some answers half-way.

At 5% 503 + 2% cut, every direction among local, s3, gs and az completes and verifies deep; at
20% + 10% a run either completes verified or fails with one line and no manifest. A completion
whose answer is cut is recognised, not sent again; a skewed clock is one error, not retried.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from bridge.errors import TransientError
from bridge.stores import get_store
from bridge.urls import parse
from tests.emulators import unique_name
from tests.faultproxy import FaultProxy, Rule, proxied_environment
from tests.helpers import has_record, mcbridge, settings_for
from bridge.pipeline import verify as verifying

KINDS = ("local", "s3", "gs", "az")
CLOUDS = ("s3", "gs", "az")
BIG = 12 * 1024 * 1024 + 4321   # three parts of 5 MiB


def tree() -> dict[str, bytes]:
    files = {f"small/{i:02d}.txt": os.urandom(100 + 997 * i) for i in range(12)}
    files["big/ckpt.bin"] = os.urandom(BIG)
    return files


@pytest.fixture(scope="module")
def proxies(moto, fake_gcs, azurite):
    started = {scheme: FaultProxy(emu.endpoint).start()
               for scheme, emu in (("s3", moto), ("gs", fake_gcs), ("az", azurite))}
    yield started
    for proxy in started.values():
        proxy.stop()


@pytest.fixture(scope="module")
def direct_env(emulator_env):
    return dict(emulator_env)


@pytest.fixture(scope="module")
def proxied_env(emulator_env, proxies):
    """The emulators' environment with every endpoint pointing at its proxy."""
    env = proxied_environment(emulator_env, proxies)
    return env


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, direct_env, moto, fake_gcs, azurite):
    """The same small tree and one multipart file on each store, put there without faults."""
    base = tmp_path_factory.mktemp("faults")
    files = tree()
    for rel, data in files.items():
        (base / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / "src" / rel).write_bytes(data)
    roots = {"local": f"{base / 'src'}/"}
    for kind, emulator in (("s3", moto), ("gs", fake_gcs), ("az", azurite)):
        bucket = unique_name("src")
        emulator.create_bucket(bucket)
        roots[kind] = f"{kind}://{bucket}/tree/"
        r = mcbridge("cp", roots["local"], roots[kind], "--chunk-size", "5MiB", "-q",
                     env=direct_env, state_dir=base / "state")
        assert r.returncode == 0, r.stderr
    return files, roots


def configure(proxies, **kwargs) -> None:
    for proxy in proxies.values():
        proxy.configure(**kwargs)


def faulty(proxies, error_rate: float, cut_rate: float, seed: int) -> None:
    """Random faults at these rates, plus a cut third answer on every proxy, so that each run
    meets at least one fault however few requests it sends."""
    for n, proxy in enumerate(proxies.values()):
        proxy.configure(error_rate=error_rate, cut_rate=cut_rate, seed=seed * 10 + n,
                        rules=[Rule(".", "cut", after=2)])


def has_manifest(url: str, env: dict[str, str]) -> bool:
    return has_record(url, env)


def verify_deep(url: str, env, tmp_path: Path) -> None:
    """`mcbridge verify --deep`, in this process (the CLI's start-up would double the file's time)."""
    report = verifying.verify(url, settings_for(env), deep=True)
    assert report["ok"] and report["checked"] > 0, report


PAIRS = [(a, b) for a, b in itertools.permutations(KINDS, 2)]


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_copy_completes_and_verifies_through_5pc_errors_and_2pc_cuts(
        src, dst, seeded, proxies, proxied_env, direct_env, make_root, tmp_path):
    files, roots = seeded
    target = make_root(dst) + "copy/"
    faulty(proxies, 0.05, 0.02, seed=PAIRS.index((src, dst)))
    r = mcbridge("cp", roots[src], target, "--chunk-size", "5MiB", "-q",
                 env=proxied_env, state_dir=tmp_path)
    counts = {k: dict(p.counts) for k, p in proxies.items() if p.counts["requests"]}
    print(f"{src} -> {dst}: {counts}")
    assert r.returncode == 0, (r.stderr, counts)
    assert sum(p.faults for p in proxies.values()) > 0, counts  # the faults really happened
    configure(proxies)
    verify_deep(target, direct_env, tmp_path)


HARSH = [("local", "s3"), ("gs", "local"), ("az", "gs"), ("s3", "az")]


@pytest.mark.parametrize("src,dst", HARSH, ids=[f"{a}-to-{b}" for a, b in HARSH])
def test_at_20pc_errors_and_10pc_cuts_a_copy_completes_or_fails_in_one_line(
        src, dst, seeded, proxies, proxied_env, direct_env, make_root, tmp_path):
    _files, roots = seeded
    target = make_root(dst) + "copy/"
    faulty(proxies, 0.20, 0.10, seed=100 + HARSH.index((src, dst)))
    r = mcbridge("cp", roots[src], target, "--chunk-size", "5MiB", "-q", env=proxied_env, state_dir=tmp_path)
    counts = {k: dict(p.counts) for k, p in proxies.items() if p.counts["requests"]}
    print(f"{src} -> {dst}: exit {r.returncode}, {counts}, {r.stderr.strip()!r}")
    assert sum(p.faults for p in proxies.values()) > 0, counts
    configure(proxies)
    if r.returncode == 0:
        verify_deep(target, direct_env, tmp_path)
    else:
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert not has_manifest(target, direct_env)


# The request that completes a multipart upload, per store.
COMPLETION = {
    "s3": r"^POST .*\?uploadId=",                       # CompleteMultipartUpload
    "gs": r"^POST /storage/v1/b/[^/]+/o/copy%2Fckpt\.bin/compose",  # the final compose
    "az": r"^PUT .*comp=blocklist",                     # Put Block List
}


@pytest.mark.parametrize("dst", CLOUDS)
def test_a_completion_whose_answer_is_cut_is_recognised(dst, seeded, proxies, proxied_env, direct_env,
                                                        make_root, tmp_path):
    _files, roots = seeded
    target = make_root(dst) + "copy/"
    configure(proxies, rules=[Rule(COMPLETION[dst], "cut")])
    r = mcbridge("cp", roots["local"] + "big/", target, "--chunk-size", "5MiB", "-q",
                 env=proxied_env, state_dir=tmp_path)
    proxy = proxies[dst]
    completions = [line for line, _ in proxy.log if Rule(COMPLETION[dst], "cut").matches(line)]
    assert r.returncode == 0, (r.stderr, proxy.log)
    # Cut once, and not sent again: the retry found the object the first attempt made.
    assert proxy.counts["cut"] == 1 and len(completions) == 1, proxy.log
    configure(proxies)
    assert has_manifest(target, direct_env)
    verify_deep(target, direct_env, tmp_path)


def test_a_completion_retried_after_its_parts_are_gone_is_recognised(seeded, proxies, proxied_env, direct_env,
                                                                    make_root, fake_gcs, tmp_path):
    """GCS: the first compose's answer is lost and every later compose fails (as when the parts
    are gone): the object the first one made is found, and the copy commits."""
    _files, roots = seeded
    target = make_root("gs") + "copy/"
    configure(proxies, rules=[Rule(COMPLETION["gs"], "cut"), Rule(COMPLETION["gs"], "error", times=99)])
    r = mcbridge("cp", roots["local"] + "big/", target, "--chunk-size", "5MiB", "-q",
                 env=proxied_env, state_dir=tmp_path)
    assert r.returncode == 0, (r.stderr, proxies["gs"].log)
    configure(proxies)
    verify_deep(target, direct_env, tmp_path)


def test_parts_that_cannot_be_cleaned_up_are_leftovers_not_a_failure(seeded, proxies, proxied_env, direct_env,
                                                                      make_root, tmp_path):
    _files, roots = seeded
    target = make_root("gs") + "copy/"
    configure(proxies, rules=[Rule(r"^DELETE .*_bridge%2Fuploads%2F", "error", times=10_000)])
    r = mcbridge("cp", roots["local"] + "big/", target, "--chunk-size", "5MiB", "-q",
                 env=proxied_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert proxies["gs"].counts["error"] > 0
    configure(proxies)
    verify_deep(target, direct_env, tmp_path)
    left = mcbridge("uploads", target, "--abort", env=direct_env, state_dir=tmp_path)
    assert left.returncode == 0 and "ckpt.bin" in left.stdout, left.stdout + left.stderr
    assert "ckpt.bin" not in mcbridge("uploads", target, env=direct_env, state_dir=tmp_path).stdout


SKEWED = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>RequestTimeTooSkewed</Code>'
          b'<Message>The difference between the request time and the current time is too large.</Message>'
          b'<MaxAllowedSkewMilliseconds>900000</MaxAllowedSkewMilliseconds></Error>')


def test_a_skewed_clock_is_one_clear_error_and_not_retried(seeded, proxies, proxied_env, make_root, tmp_path):
    _files, roots = seeded
    target = make_root("s3") + "copy/"
    # Not HEAD requests: an answer to HEAD has no body to say why, so it is a plain 403.
    configure(proxies, rules=[Rule(r"^(?!HEAD)", "reply", times=10_000,
                                   reply=(403, {"Content-Type": "application/xml"}, SKEWED))])
    r = mcbridge("cp", roots["local"], target, "-q", env=proxied_env, state_dir=tmp_path)
    refused = proxies["s3"].counts["reply"]
    configure(proxies)
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "clock" in r.stderr, r.stderr
    assert refused == 1  # refused once, not sent again


def test_a_copy_that_cannot_commit_fails_in_one_line_and_leaves_no_manifest(
        seeded, proxies, proxied_env, direct_env, make_root, tmp_path):
    """At 20% + 10%, with every write of the manifest refused: the failure branch of the harsh
    runs above, made certain. The manifest PUT is sent 1 + retries times (the bound), no more."""
    _files, roots = seeded
    target = make_root("s3") + "copy/"
    faulty(proxies, 0.20, 0.10, seed=7)
    proxies["s3"].rules.insert(0, Rule(r"^PUT /[^?]*_bridge/log/c-", "error", times=10_000))
    r = mcbridge("cp", roots["local"] + "small/", target, "-q", env=proxied_env, state_dir=tmp_path)
    manifest_puts = [line for line, _ in proxies["s3"].log if "_bridge/log/c-" in line
                     and line.startswith("PUT")]
    configure(proxies)
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(manifest_puts) == 1 + 5, manifest_puts  # transfer.retries defaults to 5
    assert not has_manifest(target, direct_env)


def test_an_azure_read_cut_every_time_is_sent_once_per_retry_and_no_more(seeded, proxies, proxied_env, direct_env):
    """The blob SDK's downloader would send a GET again up to three times when its body is cut,
    under bridge's own retries; bridge's Azure read sends exactly 1 + retries GETs in all."""
    files, roots = seeded
    loc = parse(roots["az"]).as_prefix().join("small/05.txt")
    store = get_store(loc, settings_for(proxied_env, retries=2))
    configure(proxies, rules=[Rule(r"^GET /[^?]*small/05\.txt", "cut", times=10_000)])
    try:
        with pytest.raises(TransientError):
            store.read(loc, 10, 100)
        gets = [line for line, _ in proxies["az"].log if line.startswith("GET") and "small/05.txt" in line]
    finally:
        configure(proxies)
    assert len(gets) == 1 + 2, gets
    assert store.read(loc, 10, 100) == files["small/05.txt"][10:110]
    assert store.read(loc) == files["small/05.txt"]
