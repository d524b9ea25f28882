"""Settings resolve in one order: defaults < settings file profile < environment < flags."""

from __future__ import annotations

import pytest

from bridge.config import S3Settings, SecretStr, Settings, TransferSettings, load_settings, parse_size
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


@pytest.mark.parametrize("overrides,message", [
    ({"transfer": {"concurrency": "many"}}, "transfer.concurrency: must be a whole number, not 'many'"),
    ({"transfer": {"concurrency": True}}, "transfer.concurrency: must be a whole number, not True"),   # a bool is no count
    ({"s3": {"region": 5}}, "s3.region: must be a string, not int"),
    ({"azure": {"sas_token": 12345}}, "azure.sas_token: must be a string, not int"),   # never the value
    ({"s3": "eu-west-1"}, "s3: must be a mapping"),
    ({"native": {"poll_interval": "soon"}}, "native.poll_interval: must be a number, not 'soon'"),
    ({"pricing": {"interconnects": [{"between": ["aws:*"], "usd_per_gb": 0.02}]}},
     "pricing.interconnects.0.between: must be a list of 2"),
    ({"pricing": {"interconnects": [{"between": ["aws:*", "site:hpc"]}]}}, "pricing.interconnects.0.usd_per_gb: missing"),
])
def test_a_wrong_type_names_the_setting(overrides, message):
    with pytest.raises(InvalidOption) as caught:
        load_settings(overrides, environ={})
    assert str(caught.value) == f"invalid setting {message}"


@pytest.mark.parametrize("overrides,message", [
    ({"transfer": {"concurrency": 0}}, "transfer.concurrency: must be at least 1"),
    ({"transfer": {"concurrency": 257}}, "transfer.concurrency: must be at most 256"),
    ({"native": {"poll_interval": 0}}, "native.poll_interval: must be greater than 0"),
    ({"pricing": {"discounts": {"aws": {"egress_pct": 101}}}}, "pricing.discounts.aws.egress_pct: must be at most 100"),
    ({"cache": {"high_watermark": 1.5}}, "cache.high_watermark: must be at most 1"),
])
def test_an_out_of_range_value_names_the_setting_and_the_bound(overrides, message):
    with pytest.raises(InvalidOption) as caught:
        load_settings(overrides, environ={})
    assert str(caught.value) == f"invalid setting {message}"


def test_a_choice_outside_its_choices_is_refused():
    with pytest.raises(InvalidOption, match=r"^invalid setting transfer\.store_checksums: must be one of "
                                            r"require, readback, skip, not 'maybe'$"):
        load_settings(environ={"MCBRIDGE_STORE_CHECKSUMS": "maybe"})
    with pytest.raises(InvalidOption, match=r"^invalid setting native\.enabled\.1: must be one of sts, datasync"):
        load_settings(environ={"MCBRIDGE_NATIVE_ROUTES": "sts, rsync"})
    with pytest.raises(InvalidOption, match=r"^invalid setting pricing\.discounts\.ibm: must be one of aws, gcp, azure"):
        load_settings({"pricing": {"discounts": {"ibm": {"egress_pct": 5}}}}, environ={})
    with pytest.raises(InvalidOption, match=r"^invalid setting pricing\.runs_in: 'moon' does not match"):
        load_settings({"pricing": {"runs_in": "moon"}}, environ={})


def test_the_environment_and_yaml_are_coerced_to_the_fields_types(tmp_path):
    s = load_settings(environ={"MCBRIDGE_CONCURRENCY": "12", "MCBRIDGE_POLL_INTERVAL": "2.5",
                               "MCBRIDGE_NATIVE_ROUTES": "sts, datasync", "MCBRIDGE_CACHE_QUOTA": "1GiB"})
    assert s.transfer.concurrency == 12 and type(s.transfer.concurrency) is int
    assert s.native.poll_interval == 2.5 and s.native.enabled == ["sts", "datasync"]
    assert s.cache.quota == 1024**3
    cfg = tmp_path / "c.yaml"
    cfg.write_text("profiles:\n  default:\n    Transfer: {read_timeout: 30, concurrency: 4.0}\n"
                   "    pricing: {interconnects: [{between: [aws:us-east-1, site:hpc], usd_per_gb: 0.02}],\n"
                   "              speeds: {direct: {bytes_per_s: 1e9}}}\n")
    s = load_settings(config_path=cfg, environ={})   # a section's name in any case
    assert s.transfer.read_timeout == 30.0 and type(s.transfer.read_timeout) is float
    assert s.transfer.concurrency == 4 and type(s.transfer.concurrency) is int
    assert s.pricing.interconnects[0].between == ("aws:us-east-1", "site:hpc")
    assert s.pricing.speeds["direct"].model_dump() == {"bytes_per_s": 1e9, "requests_per_s": None, "startup_s": None}


def test_settings_built_from_keywords_are_checked():
    assert TransferSettings().concurrency == 8 and S3Settings(endpoint_url="http://x").endpoint_url == "http://x"
    with pytest.raises(InvalidOption, match=r"^invalid setting bogus: unknown setting$"):
        TransferSettings(bogus=1)
    with pytest.raises(InvalidOption, match=r"^invalid setting transfer\.chunk_size: chunk size 0 must be at least 1 byte$"):
        Settings(transfer={"chunk_size": 0})


def test_secrets_hide_in_the_whole_settings_and_compare_by_value():
    s = load_settings(environ={"AWS_SECRET_ACCESS_KEY": "hunter2", "AZURE_STORAGE_SAS_TOKEN": "sv=x&sig=y"})
    assert "hunter2" not in repr(s) and "sig=y" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert repr(s.s3.secret_access_key) == "SecretStr('**********')" and str(s.s3.secret_access_key) == "**********"
    assert s.s3.secret_access_key.get_secret_value() == "hunter2"
    assert s.s3.secret_access_key == SecretStr("hunter2") != SecretStr("hunter3")
    assert s.model_dump()["s3"]["secret_access_key"] == SecretStr("hunter2")   # left a SecretStr, as it was


def test_model_copy_changes_only_what_it_names():
    s = load_settings(environ={"AWS_REGION": "eu-west-1", "MCBRIDGE_CONCURRENCY": "3"})
    copied = s.model_copy(update={"s3": s.s3.model_copy(update={"session_token": SecretStr("t")})})
    assert copied.s3.session_token == SecretStr("t") and copied.s3.region == "eu-west-1"
    assert s.s3.session_token is None and copied.transfer is s.transfer and copied != s
    assert copied.model_copy(update={"s3": s.s3}) == s


def test_equal_settings_share_a_store_fingerprint():
    from bridge.stores import fingerprint
    env = {"AWS_SECRET_ACCESS_KEY": "k", "HOME": "/home/u"}
    a, b = load_settings(environ=env), load_settings(environ=env)
    assert a == b and a is not b and fingerprint(a) == fingerprint(b)
    other = load_settings(environ={**env, "AWS_SECRET_ACCESS_KEY": "k2"})
    assert other != a and fingerprint(other) != fingerprint(a)   # the secret counts, though it does not print


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


def test_the_callers_overrides_are_left_as_given(tmp_path):
    """load_settings fills in the default state and cache folders on its own copy."""
    overrides = {"transfer": {"concurrency": 3}, "cache": {"quota": "1GiB"}}
    s = load_settings(overrides, environ={"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)})
    assert s.transfer.concurrency == 3 and s.transfer.state_dir and s.cache.dir
    assert overrides == {"transfer": {"concurrency": 3}, "cache": {"quota": "1GiB"}}


def test_a_settings_file_has_every_mistake_named_by_file_and_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("profiles:\n  default:\n    transfer:\n      concurency: 4\n      retries: 99\n"
                   "    s3: {endpoint_url: 'htp:/x'}\n")
    with pytest.raises(InvalidOption) as caught:
        load_settings(config_path=cfg, environ={})
    assert sorted(str(caught.value).splitlines()) == sorted([
        f"{cfg}:4: invalid setting transfer.concurency: unknown setting (did you mean concurrency?)",
        f"{cfg}:5: invalid setting transfer.retries: must be at most 20",
        f"{cfg}:6: invalid setting s3.endpoint_url: 'htp:/x' is not an endpoint URL: use http(s)://HOST[:PORT]"])
    # a value the environment gives is the environment's mistake, not the file's
    with pytest.raises(InvalidOption) as caught:
        load_settings(config_path=cfg, environ={"AWS_ENDPOINT_URL": "nope"})
    assert any(line.startswith("invalid setting s3.endpoint_url") for line in str(caught.value).splitlines())


def test_the_cli_prints_every_settings_mistake_on_its_one_line(tmp_path):
    from tests.helpers import mcbridge
    cfg = tmp_path / "c.yaml"
    cfg.write_text("profiles:\n  default:\n    transfer:\n      concurency: 4\n      retries: 99\n")
    r = mcbridge("ls", str(tmp_path), "--config", str(cfg), env={"MCBRIDGE_CONCURRENCY": "0"}, state_dir=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    for part in (f"{cfg}:4: invalid setting transfer.concurency", f"{cfg}:5: invalid setting transfer.retries",
                 "transfer.concurrency: must be at least 1 (from MCBRIDGE_CONCURRENCY)"):
        assert part in r.stderr, r.stderr
