"""Bad input through the real CLI: exit 2 and one line on stderr naming what is wrong, never
"internal error" or a traceback, and nothing run or queued.

The table below is the inventory: each row a command line (with its environment) that once
ended as exit 1 "internal error: <Python exception>", or was accepted when it should not have
been (nan as a limit, an empty string taken as "unset", an option that does not apply).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import redis

from tests.emulators import free_port
from tests.helpers import mcbridge

BARE = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8"}
REDIS_URL = "redis://127.0.0.1:6379/0"


def refused(r, *needles: str) -> str:
    """Exit 2, one line on stderr naming the input; the line."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("mcbridge: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def inputs(tmp_path):
    """Files and folders the table refers to by {name}."""
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "dir").mkdir()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_text("a")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "latin1.yaml").write_bytes(b"policies:\n  caf\xe9: {}\n")
    (tmp_path / "deep.yaml").write_text("profiles: " + "[" * 5000 + "]" * 5000 + "\n")
    (tmp_path / "deep-policy.yaml").write_text("policies: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")
    yamls = {
        "section-int": "profiles: {default: {transfer: 5}}\n",
        "section-key-int": "profiles: {default: {1: 2}}\n",
        "endpoint": "profiles: {default: {s3: {endpoint_url: 'htp:/x'}}}\n",
        "timeout-nan": "profiles: {default: {transfer: {connect_timeout: .nan}}}\n",
        "timeout-negative": "profiles: {default: {transfer: {read_timeout: -1}}}\n",
        "watermark-nan": "profiles: {default: {cache: {high_watermark: .nan}}}\n",
        "egress-inf": "profiles: {default: {pricing: {month_to_date_gb: {aws: .inf}}}}\n",
    }
    for name, text in yamls.items():
        (tmp_path / f"{name}.yaml").write_text(text)
    values = {p.stem: str(p) for p in tmp_path.iterdir()}
    values["closed"] = f"redis://127.0.0.1:{free_port()}/0"   # nothing listens: nothing can be queued
    values["out"] = str(tmp_path / "out")
    values["tmp"] = str(tmp_path)
    return values


def _fill(items, values):
    return [item.format(**values) for item in items]


# (command line, extra environment, words the error line must hold)
CASES = {
    # -- 1: amounts that turn a guard off, a budget with no name
    "max-cost-nan": (["cp", "--max-cost", "nan", "{file}", "{out}"], {}, ["--max-cost", "nan"]),
    "max-cost-inf": (["cp", "--max-cost", "inf", "{file}", "{out}"], {}, ["--max-cost", "inf"]),
    "submit-max-cost-nan": (["submit", "cp", "--max-cost", "nan", "{file}", "{out}", "--broker", "{closed}"], {},
                            ["--max-cost", "nan"]),
    "budget-nan": (["budgets", "set", "team", "nan", "--broker", "{closed}"], {}, ["budget team", "nan"]),
    "budget-inf": (["budgets", "set", "team", "inf", "--broker", "{closed}"], {}, ["budget team", "inf"]),
    "budget-unnamed": (["budgets", "set", "", "5", "--broker", "{closed}"], {}, ["budget name is empty"]),
    "budget-blank": (["budgets", "set", "  ", "5", "--broker", "{closed}"], {}, ["budget name is empty"]),
    # -- 2: an empty string is not "unset"; an option that does not apply is not ignored
    "cache-evict-empty": (["cache", "evict", ""], {"MCBRIDGE_CACHE_DIR": "{tmp}/cache"}, ["URL is empty"]),
    "cache-evict-nothing": (["cache", "evict"], {"MCBRIDGE_CACHE_DIR": "{tmp}/cache"}, ["--all"]),
    "jobs-limit-empty": (["jobs", "limit", "abc", "", "--broker", "{closed}"], {}, ["RATE is empty"]),
    "chunk-size-empty": (["cp", "--chunk-size", "", "{file}", "{out}"], {}, ["--chunk-size is empty"]),
    "bwlimit-empty": (["cp", "--bwlimit", "", "{file}", "{out}"], {}, ["--bwlimit is empty"]),
    "profile-empty": (["cp", "--profile", "", "{file}", "{out}"], {}, ["--profile is empty"]),
    "config-empty": (["cp", "--config", "", "{file}", "{out}"], {}, ["--config is empty"]),
    "broker-empty": (["jobs", "list", "--broker", ""], {}, ["--broker is empty"]),
    "worker-queues-empty": (["worker", "-Q", "", "--broker", "{closed}"], {}, ["--queues is empty"]),
    "worker-queue-blank-item": (["worker", "-Q", "a,,b", "--broker", "{closed}"], {}, ["--queues", "'a,,b'"]),
    "migrate-shard-size-without-pack": (["migrate", "--shard-size", "abc", "{src}/", "{out}/"], {},
                                        ["--shard-size", "without --pack"]),
    "migrate-memory-without-pack": (["migrate", "--memory", "2GiB", "{src}/", "{out}/"], {},
                                    ["--memory", "without --pack"]),
    "migrate-route-with-pack": (["migrate", "--pack", "tar", "--route", "server", "{src}/", "{out}/"], {},
                                ["--route", "with --pack"]),
    "pack-row-groups-for-tar": (["pack", "--row-group-size", "1MiB", "{src}/", "{out}/"], {},
                                ["--row-group-size", "tar"]),
    "submit-migrate-shard-size-without-pack": (
        ["submit", "migrate", "--shard-size", "abc", "{src}/", "{out}/", "--broker", "{closed}"], {},
        ["--shard-size", "without --pack"]),
    "submit-migrate-route-with-pack": (
        ["submit", "migrate", "--pack", "tar", "--route", "server", "{src}/", "{out}/", "--broker", "{closed}"], {},
        ["--route", "pack job"]),
    "submit-pack-row-groups-for-tar": (
        ["submit", "pack", "--row-group-size", "1MiB", "{src}/", "{out}/", "--broker", "{closed}"], {},
        ["--row-group-size", "tar"]),
    # -- 4: what ended as "internal error: <Python exception>"
    "config-directory": (["cp", "--config", "{dir}", "{file}", "{out}"], {}, ["settings file", "{dir}", "directory"]),
    "config-binary": (["cp", "--config", "{binary}", "{file}", "{out}"], {}, ["settings file", "{binary}", "UTF-8"]),
    "config-device": (["cp", "--config", "/dev/zero", "{file}", "{out}"], {}, ["settings file /dev/zero"]),
    "config-deep": (["cp", "--config", "{deep}", "{file}", "{out}"], {}, ["settings file", "{deep}", "nested"]),
    "config-section-not-mapping": (["ls", "{src}", "--config", "{section-int}"], {},
                                   ["{section-int}", "transfer must be a mapping"]),
    "config-section-key-number": (["ls", "{src}", "--config", "{section-key-int}"], {},
                                  ["{section-key-int}", "not a section name"]),
    "config-endpoint": (["ls", "{src}", "--config", "{endpoint}"], {}, ["s3.endpoint_url", "'htp:/x'"]),
    "config-timeout-nan": (["ls", "{src}", "--config", "{timeout-nan}"], {}, ["transfer.connect_timeout", "finite"]),
    "config-timeout-negative": (["ls", "{src}", "--config", "{timeout-negative}"], {}, ["transfer.read_timeout"]),
    "config-watermark-nan": (["ls", "{src}", "--config", "{watermark-nan}"], {}, ["cache.high_watermark"]),
    "config-egress-inf": (["ls", "{src}", "--config", "{egress-inf}"], {}, ["pricing.month_to_date_gb.aws"]),
    "aws-endpoint-scheme": (["cp", "{file}", "s3://bucket/f.txt"], {"AWS_ENDPOINT_URL": "htp:/x"},
                            ["AWS_ENDPOINT_URL", "'htp:/x'"]),
    "aws-endpoint-ipv6": (["cp", "{file}", "s3://bucket/f.txt"], {"AWS_ENDPOINT_URL": "http://[::1"},
                          ["AWS_ENDPOINT_URL", "Invalid IPv6"]),
    "aws-endpoint-port": (["cp", "{file}", "s3://bucket/f.txt"], {"AWS_ENDPOINT_URL": "http://127.0.0.1:99999"},
                          ["AWS_ENDPOINT_URL", "Port out of range"]),
    "gcs-emulator-port": (["cp", "{file}", "gs://bucket/f.txt"], {"STORAGE_EMULATOR_HOST": "127.0.0.1:abc"},
                          ["STORAGE_EMULATOR_HOST", "127.0.0.1:abc"]),
    "gcs-emulator-scheme": (["cp", "{file}", "gs://bucket/f.txt"], {"STORAGE_EMULATOR_HOST": "ftp://127.0.0.1"},
                            ["STORAGE_EMULATOR_HOST", "ftp://"]),
    "aws-profile-unknown": (["cp", "{file}", "s3://bucket/f.txt"],
                            {"AWS_PROFILE": "no-such-profile", "AWS_CONFIG_FILE": "{tmp}/none",
                             "AWS_SHARED_CREDENTIALS_FILE": "{tmp}/none"}, ["AWS_PROFILE", "'no-such-profile'"]),
    "aws-config-file-garbage": (["cp", "{file}", "s3://bucket/f.txt"],
                                {"AWS_PROFILE": "p", "AWS_CONFIG_FILE": "{file}"}, ["AWS_CONFIG_FILE", "{file}"]),
    "sts-endpoint": (["ls", "{src}"], {"MCBRIDGE_STS_ENDPOINT": "::"}, ["MCBRIDGE_STS_ENDPOINT"]),
    "poll-interval-nan": (["ls", "{src}"], {"MCBRIDGE_POLL_INTERVAL": "nan"}, ["MCBRIDGE_POLL_INTERVAL", "finite"]),
    "native-routes": (["ls", "{src}"], {"MCBRIDGE_NATIVE_ROUTES": "bogus"}, ["MCBRIDGE_NATIVE_ROUTES", "bogus"]),
    "cache-dir-a-file": (["cache", "stat"], {"MCBRIDGE_CACHE_DIR": "{file}"}, ["cache directory", "{file}"]),
    "broker-scheme": (["submit", "cp", "{file}", "{out}", "--broker", "x"], {}, ["--broker", "not a Redis URL"]),
    "broker-ipv6": (["jobs", "list", "--broker", "redis://:secret@[x"], {}, ["--broker", "Invalid IPv6"]),
    "broker-database": (["jobs", "list", "--broker", "redis://127.0.0.1/abc"], {}, ["--broker", "'abc'"]),
    "broker-env": (["jobs", "list"], {"BRIDGE_BROKER_URL": "http://x"}, ["BRIDGE_BROKER_URL", "not a Redis URL"]),
    "bwlimit-file-binary": (["cp", "--bwlimit-file", "{binary}", "{file}", "{out}"], {},
                            ["--bwlimit-file", "{binary}"]),
    "bwlimit-file-device": (["cp", "--bwlimit-file", "/dev/zero", "{file}", "{out}"], {}, ["bandwidth limit"]),
    "cat-output-directory": (["cat", "{tmp}/packed/", "a.txt", "-o", "{dir}"], {}, ["--output", "{dir}", "directory"]),
    "cat-output-nowhere": (["cat", "{tmp}/packed/", "a.txt", "-o", "{file}/x"], {}, ["--output", "not a directory"]),
    "policy-invalid-utf8": (["policy", "check", "{latin1}"], {}, ["{latin1}:2", "not UTF-8"]),
    "policy-deep": (["policy", "check", "{deep-policy}"], {}, ["{deep-policy}", "nested too deeply"]),
    "policy-directory": (["policy", "check", "{dir}"], {}, ["{dir}", "directory"]),
    "policy-device": (["policy", "check", "/dev/zero"], {}, ["/dev/zero", "not a regular file"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, inputs, tmp_path):
    args, env, needles = CASES[case]
    if "{tmp}/packed/" in args:
        packed = mcbridge("pack", "-q", f"{inputs['src']}/", f"{tmp_path}/packed/", env=BARE, state_dir=tmp_path / "s")
        assert packed.returncode == 0, packed.stderr
    env = {**BARE, **{k: v.format(**inputs) for k, v in env.items()}}
    r = mcbridge(*_fill(args, inputs), env=env, state_dir=tmp_path / "state", timeout=60)
    refused(r, *_fill(needles, inputs))
    assert not os.path.exists(inputs["out"])
    assert "secret" not in r.stderr


def test_a_state_dir_that_cannot_be_made_is_named(inputs, tmp_path):
    """MCBRIDGE_STATE_DIR under a file (mcbridge() sets that variable from ``state_dir``)."""
    state = Path(inputs["file"]) / "state"
    r = mcbridge("cp", inputs["file"], inputs["out"], env=BARE, state_dir=state)
    refused(r, "state directory", str(state), "not a directory")
    assert not os.path.exists(inputs["out"])


def test_an_empty_evict_leaves_the_cache_alone(inputs, tmp_path):
    env = {**BARE, "MCBRIDGE_CACHE_DIR": str(tmp_path / "cache")}
    assert mcbridge("cache", "path", inputs["file"], env=env, state_dir=tmp_path / "state").returncode == 0
    refused(mcbridge("cache", "evict", "", env=env, state_dir=tmp_path / "state"), "URL is empty")
    listed = mcbridge("cache", "ls", "--json", env=env, state_dir=tmp_path / "state")
    assert listed.returncode == 0 and "file.txt" in listed.stdout, listed.stdout


@pytest.fixture
def namespace():
    """A Redis namespace of this test's own, and a way to count its keys."""
    ns = f"t-bad-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(REDIS_URL)
    yield ns, lambda: list(client.scan_iter(match=f"{ns}:*", count=1000))
    for key in client.scan_iter(match=f"{ns}:*", count=1000):
        client.delete(key)


@pytest.mark.parametrize("flags,needle", [
    (["--route", "bogus"], "unknown route 'bogus'"),
    (["--chunk-size", "0"], "at least 1 byte"),
    (["--chunk-size", "lots"], "invalid size"),
    (["--chunk-size", ""], "--chunk-size is empty"),
    (["--store-checksums", "sometimes"], "'sometimes' is not one of 'require', 'readback', 'skip'"),
    (["--bwlimit", "fast"], "invalid bandwidth limit"),
    (["--profile", " "], "--profile is empty"),
    (["--max-cost", "nan"], "--max-cost nan"),
])
def test_submit_refuses_what_cp_refuses_in_the_same_words_before_redis(flags, needle, inputs, namespace, tmp_path):
    ns, keys = namespace
    env = {**BARE, "BRIDGE_NAMESPACE": ns}
    cp = refused(mcbridge("cp", *flags, inputs["file"], inputs["out"], env=env, state_dir=tmp_path / "state"), needle)
    submitted = mcbridge("submit", "cp", *flags, inputs["file"], inputs["out"], "--broker", REDIS_URL, env=env,
                         state_dir=tmp_path / "state")
    assert refused(submitted, needle) == cp
    assert keys() == [], "a refused job reached Redis"


def test_submit_still_queues_good_flags(inputs, namespace, tmp_path):
    """The check refuses only what is wrong: the same flags, valid, queue a job."""
    ns, keys = namespace
    from bridge.workers.testing import tenant_env
    r = mcbridge("submit", "cp", "--route", "direct", "--chunk-size", "8MiB", "--bwlimit", "off", inputs["file"],
                 inputs["out"], "--broker", REDIS_URL,
                 env={**BARE, "BRIDGE_NAMESPACE": ns, **tenant_env(tmp_path / "tenant")},
                 state_dir=tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert keys(), "nothing was queued"
