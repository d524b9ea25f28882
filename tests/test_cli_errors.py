"""Bad input: one clear line on stderr, no traceback; exit 2 for usage, 1 for run-time failures."""

from __future__ import annotations

import os

import pytest

from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, free_port
from tests.helpers import mcbridge

# An environment with no credentials of any kind (and no metadata-server lookups).
BARE = {"PATH": os.environ["PATH"], "HOME": "/nonexistent-home", "LANG": "C.UTF-8"}


def one_line_error(r, code: int, *needles: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("mcbridge: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def src_file(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("x")
    return str(path)


@pytest.mark.parametrize("url,needle", [
    ("foo://bucket/key", "unknown scheme 'foo'"),
    ("s3:///key", "missing bucket"),
    ("gs://", "missing bucket"),
    ("az://UPPER/key", "not a valid az bucket name"),
    ("s3://b/k", "not a valid s3 bucket name"),
    ("s3://bucket//key", "empty path segment"),
    ("file://host/path", "file URLs take an absolute path"),
    ("://nothing", "malformed URL"),
])
def test_malformed_urls_exit_2(url, needle, src_file, tmp_path):
    one_line_error(mcbridge("cp", src_file, url, env=BARE, state_dir=tmp_path), 2, needle)


def test_usage_errors_exit_2(tmp_path, src_file):
    one_line_error(mcbridge("cp", src_file, env=BARE, state_dir=tmp_path), 2, "Missing argument")
    one_line_error(mcbridge("cp", "--chunk-size", "5XB", src_file, "/tmp/x", env=BARE, state_dir=tmp_path), 2,
                   "invalid size")
    one_line_error(mcbridge("cp", "-j", "0", src_file, "/tmp/x", env=BARE, state_dir=tmp_path), 2, "concurrency")


def test_missing_local_source(tmp_path):
    one_line_error(mcbridge("cp", str(tmp_path / "nope"), str(tmp_path / "out"), env=BARE, state_dir=tmp_path),
                   1, "no such object, prefix or directory")


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_missing_bucket(scheme, src_file, env_for, tmp_path):
    r = mcbridge("cp", src_file, f"{scheme}://no-such-bucket-here/f.txt", env=env_for(scheme), state_dir=tmp_path)
    one_line_error(r, 1, "no-such-bucket-here", "does not exist")


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_missing_source_object(scheme, make_root, env_for, tmp_path):
    root = make_root(scheme)
    r = mcbridge("cp", root + "not/there.bin", str(tmp_path / "out"), env=env_for(scheme), state_dir=tmp_path)
    one_line_error(r, 1, "not/there.bin", "no such object")


@pytest.mark.parametrize("scheme,needle", [
    ("s3", "no AWS credentials"), ("gs", "no Google credentials"), ("az", "no Azure credentials")])
def test_missing_credentials(scheme, needle, src_file, tmp_path):
    one_line_error(mcbridge("cp", src_file, f"{scheme}://some-bucket/f.txt", env=BARE, state_dir=tmp_path),
                   1, needle)


def _closed_port_env(scheme: str) -> dict[str, str]:
    port = free_port()  # nothing listens there
    if scheme == "s3":
        return {**BARE, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "k",
                "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}
    if scheme == "gs":
        return {**BARE, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}"}
    return {**BARE, "AZURE_STORAGE_CONNECTION_STRING":
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURITE_ACCOUNT};"}


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_unreachable_endpoint(scheme, src_file, tmp_path):
    r = mcbridge("cp", src_file, f"{scheme}://some-bucket/f.txt", env=_closed_port_env(scheme), state_dir=tmp_path,
                 timeout=120)
    one_line_error(r, 1, "cannot reach the", "endpoint")


def test_verify_without_manifest(tmp_path):
    (tmp_path / "d").mkdir()
    one_line_error(mcbridge("verify", str(tmp_path / "d"), env=BARE, state_dir=tmp_path), 1, "no manifest")


# -- malformed input ----------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["s3:/bucket/x", "s3:bucket/x", "gs:/bucket/x", "gs:bucket", "az:/cont/x",
                                 "AZ:cont/x", "file:/tmp/x"])
def test_a_url_of_a_known_scheme_missing_its_slashes_is_bad_input(url, src_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a folder "s3:" would appear; python -m then finds bridge on PYTHONPATH
    env = {**BARE, **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    r = mcbridge("cp", src_file, url, env=env, state_dir=tmp_path / "state")
    one_line_error(r, 2, f"malformed URL {url!r}")
    assert not any(p.name.lower().startswith(url.split(":")[0].lower()) for p in tmp_path.iterdir())


@pytest.mark.parametrize("size,needle", [("0", "at least 1 byte"), ("-8MiB", "invalid size"),
                                         ("lots", "invalid size"), ("0MiB", "at least 1 byte")])
@pytest.mark.parametrize("command", ["cp", "sync"])
def test_bad_chunk_sizes_exit_2(command, size, needle, src_file, tmp_path):
    out = tmp_path / "out"
    r = mcbridge(command, f"--chunk-size={size}", src_file, str(out), env=BARE, state_dir=tmp_path / "state")
    one_line_error(r, 2, needle)
    assert not out.exists()


def test_a_chunk_size_over_the_destination_limit_exits_2(src_file, make_root, env_for, tmp_path):
    dst = make_root("s3")
    r = mcbridge("cp", "--chunk-size", "6GiB", src_file, dst, env=env_for("s3"), state_dir=tmp_path)
    one_line_error(r, 2, "over the s3:// limit")
    r = mcbridge("cp", "--chunk-size", "5GiB", src_file, dst, env=env_for("s3"), state_dir=tmp_path)
    assert r.returncode == 0, r.stderr   # the limit itself is allowed


@pytest.mark.parametrize("value", ["garbage", "AccountKey=abc", "a=b;c"])
def test_a_malformed_azure_connection_string_is_one_line(value, src_file, tmp_path):
    r = mcbridge("cp", src_file, "az://cont/f.txt", env={**BARE, "AZURE_STORAGE_CONNECTION_STRING": value},
                 state_dir=tmp_path)
    assert r.returncode in (1, 2)
    one_line_error(r, r.returncode, "connection string")


def test_an_azure_connection_string_without_a_key_is_missing_credentials(src_file, tmp_path):
    value = "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;BlobEndpoint=http://127.0.0.1:9/x;"
    r = mcbridge("cp", src_file, "az://cont/f.txt", env={**BARE, "AZURE_STORAGE_CONNECTION_STRING": value},
                 state_dir=tmp_path)
    one_line_error(r, 1, "no AccountKey or SharedAccessSignature")


@pytest.mark.parametrize("command", ["cp", "sync"])
@pytest.mark.parametrize("dst", ["sub/", "sub/deeper/", ""])
def test_a_local_destination_inside_its_source_exits_2(command, dst, tmp_path):
    src = tmp_path / "a"
    src.mkdir()
    (src / "x.txt").write_text("x")
    r = mcbridge(command, f"{src}/", f"{src}/{dst}", env=BARE, state_dir=tmp_path / "state")
    one_line_error(r, 2, "inside it")
    assert sorted(p.name for p in src.iterdir()) == ["x.txt"]


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_a_bucket_prefix_inside_its_source_prefix_exits_2(scheme, make_root, emulator_for, env_for, tmp_path):
    root = make_root(scheme)
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("x")
    env = env_for(scheme)
    assert mcbridge("cp", f"{src}/", root + "x/", env=env, state_dir=tmp_path / "state").returncode == 0
    for command in ("cp", "sync"):
        r = mcbridge(command, root + "x/", root + "x/y/", env=env, state_dir=tmp_path / "state")
        one_line_error(r, 2, "inside it")
    r = mcbridge("cp", root + "x/", root + "xy/", env=env, state_dir=tmp_path / "state")  # a sibling is fine
    assert r.returncode == 0, r.stderr


def test_a_newline_in_a_name_keeps_the_error_on_one_line(tmp_path):
    missing = tmp_path / "no\nsuch.txt"
    one_line_error(mcbridge("cp", str(missing), str(tmp_path / "out"), env=BARE, state_dir=tmp_path), 1,
                   "no such object")


# -- exit codes: one per error class, and the CLI takes them from the classes ---------------------

def _subclasses(root: type) -> list[type]:
    found, stack = [], [root]
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return found


def test_every_error_class_has_an_exit_code_and_the_tree_draws_it():
    import bridge.api  # noqa: F401  (the classes defined outside bridge.errors: settings, policies)
    import bridge.config  # noqa: F401
    import bridge.policies.replication  # noqa: F401
    from bridge import errors
    classes = _subclasses(errors.BridgeError)
    assert {"UnreadableText", "PolicyError", "VerifyFailed", "JobTerminated"} <= {c.__name__ for c in classes}
    for cls in classes:
        expected = (2 if issubclass(cls, errors.UsageError) else 143 if issubclass(cls, errors.JobTerminated)
                    else 130 if issubclass(cls, errors.JobCancelled) else 1)
        assert isinstance(cls.exit_code, int) and cls.exit_code == expected, cls
    drawn = _parents_drawn(errors.__doc__)
    for cls in classes[1:]:
        if cls.__module__ == "bridge.errors" or cls.__name__ in drawn:
            assert drawn.get(cls.__name__) == cls.__base__.__name__, cls


def _parents_drawn(doc: str) -> dict[str, str]:
    """Each class the module docstring's tree draws, and the class it is drawn under."""
    import re
    parents: dict[str, str] = {}
    above: list[tuple[int, str]] = []   # (column, name) of the classes on the path to this line
    for line in doc.splitlines():
        m = re.match(r"^(\s+)(BridgeError)\b", line) or re.match(r"^([\s│]*[├└]── )(\w+)", line)
        if not m:
            continue
        column = len(m.group(1))
        while above and above[-1][0] >= column:
            above.pop()
        if above:
            parents[m.group(2)] = above[-1][1]
        above.append((column, m.group(2)))
    return parents


def _literal_exit_codes(path) -> list[str]:
    """Calls in ``path`` that end the process or a command with a number written there."""
    import ast
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            numbers = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, int)]
            if name in ("exit", "Exit", "fail") and numbers:
                found.append(f"{path.name}:{node.lineno}")
    return found


def test_the_cli_takes_its_exit_codes_from_the_error_classes(tmp_path):
    from pathlib import Path

    import bridge.cli
    from bridge.errors import ObjectNotFound, UsageError, VerifyFailed
    from bridge.policies.replication import PolicyError
    cli = Path(bridge.cli.__file__).parent
    for name in ("__init__.py", "transfer.py", "check.py", "policy.py"):
        assert _literal_exit_codes(cli / name) == []
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    dst = tmp_path / "dst"
    r = mcbridge("cp", f"{src}/", f"{dst}/", env=BARE, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    (dst / "a.txt").write_text("changed")
    assert mcbridge("verify", f"{dst}/", env=BARE, state_dir=tmp_path).returncode == VerifyFailed.exit_code
    one_line_error(mcbridge("cp", f"{src}/nope", f"{dst}/", env=BARE, state_dir=tmp_path),
                   ObjectNotFound.exit_code, "no such object")
    one_line_error(mcbridge("cp", f"{src}/", env=BARE, state_dir=tmp_path), UsageError.exit_code, "Missing argument")
    policy = tmp_path / "p.yaml"
    policy.write_text("policies:\n  one:\n    source: nowhere\n    destinations: []\n    keep_lsat: 2\n")
    r = mcbridge("replicate", "--policy", str(policy), "--once", env=BARE, state_dir=tmp_path)
    assert r.returncode == PolicyError.exit_code and len(r.stderr.strip().splitlines()) > 1, r.stderr
