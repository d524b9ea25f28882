"""Settings resolve in one order: defaults < settings file profile < environment < flags."""

from __future__ import annotations

import pytest

from bridge.config import load_settings, parse_size
from bridge.errors import InvalidOption
from bridge.urls import parse
from bridge.errors import BadURL


def test_order_defaults_file_env_flags(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("profiles:\n  default:\n    s3: {endpoint_url: http://from-file, region: eu-west-1}\n"
                   "    transfer: {concurrency: 3, chunk_size: 32MiB}\n  dr:\n    s3: {region: us-west-2}\n")
    s = load_settings(config_path=cfg, environ={})
    assert (s.s3.endpoint_url, s.s3.region, s.transfer.concurrency) == ("http://from-file", "eu-west-1", 3)
    assert s.transfer.chunk_size == 32 * 1024 * 1024 and s.transfer.retries == 5  # default kept
    s = load_settings(config_path=cfg, environ={"AWS_ENDPOINT_URL": "http://from-env"})
    assert s.s3.endpoint_url == "http://from-env" and s.s3.region == "eu-west-1"
    s = load_settings({"s3": {"endpoint_url": "http://from-flag"}, "transfer": {"concurrency": 9}},
                      config_path=cfg, environ={"AWS_ENDPOINT_URL": "http://from-env", "MCBRIDGE_CONCURRENCY": "5"})
    assert s.s3.endpoint_url == "http://from-flag" and s.transfer.concurrency == 9
    assert load_settings(profile="dr", config_path=cfg, environ={}).s3.region == "us-west-2"


def test_missing_file_is_fine_unless_named(tmp_path):
    assert load_settings(environ={"XDG_CONFIG_HOME": str(tmp_path)}).transfer.concurrency == 8
    with pytest.raises(InvalidOption, match="does not exist"):
        load_settings(config_path=tmp_path / "nope.yaml", environ={})


@pytest.mark.parametrize("text,needle", [
    ("profiles: [1, 2]", "must be a mapping"),
    ("profiles:\n  default:\n    s3: {bogus: 1}\n", "s3.bogus"),
    ("profiles:\n  default:\n    transfer: {concurrency: 0}\n", "transfer.concurrency"),
    ("profiles: {default: {}}\n  : bad: [", "not valid YAML"),
    ("profiles: {default: 5}\n", "profile 'default' must be a mapping"),
    ("profiles: {default: [s3]}\n", "profile 'default' must be a mapping"),
])
def test_bad_settings_file_names_the_field(tmp_path, text, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(InvalidOption, match=needle.replace(".", r"\.")):
        load_settings(config_path=cfg, environ={})


def test_secrets_do_not_print():
    s = load_settings(environ={"AWS_SECRET_ACCESS_KEY": "hunter2", "AZURE_STORAGE_KEY": "k3y"})
    assert "hunter2" not in repr(s) and "k3y" not in repr(s)


def test_sizes():
    assert parse_size("8MiB") == 8 * 1024 * 1024 and parse_size("64MB") == 64_000_000
    assert parse_size("1.5GiB") == 1536 * 1024 * 1024 and parse_size(1024) == 1024
    with pytest.raises(InvalidOption):
        parse_size("lots")


def test_urls():
    loc = parse("s3://bucket/a/b.txt")
    assert (loc.scheme, loc.bucket, loc.key, loc.name) == ("s3", "bucket", "a/b.txt", "b.txt")
    assert str(parse("gs://bkt/dir/").join("x/ü.bin")) == "gs://bkt/dir/x/ü.bin"
    assert parse("file:///tmp/x%20y").local_path == "/tmp/x y"
    assert parse("/tmp/").is_prefix
    with pytest.raises(BadURL):
        parse("ftp://host/x")


def test_state_dir_from_environment_or_default(tmp_path):
    assert load_settings(environ={"MCBRIDGE_STATE_DIR": str(tmp_path)}).transfer.state_dir == str(tmp_path)
    assert load_settings(environ={"XDG_STATE_HOME": "/x/state"}).transfer.state_dir == "/x/state/mcbridge"
    assert load_settings(environ={"HOME": "/home/u"}).transfer.state_dir == "/home/u/.local/state/mcbridge"
