"""Records at scale: ``verify`` above committed copies, and a sync that decides from listings."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import re
import time

from bridge.urls import parse
from tests.helpers import mcbridge


def test_verify_at_a_bucket_root_reports_each_committed_copy(make_root, emulator_env, tmp_path):
    src = tmp_path / "src"
    for folder in ("a", "b"):
        (src / folder).mkdir(parents=True)
        (src / folder / "x.bin").write_bytes(os.urandom(300))
    (tmp_path / "v.txt").write_bytes(b"one object\n")
    bucket = make_root("s3")
    for name in ("one", "two", "three"):
        assert mcbridge("cp", f"{src}/", f"{bucket}{name}/", "-q", env=emulator_env,
                        state_dir=tmp_path).returncode == 0
    # a single object copied to the bucket's root records that object, and claims nothing else
    assert mcbridge("cp", str(tmp_path / "v.txt"), f"{bucket}v.txt", "-q", env=emulator_env,
                    state_dir=tmp_path).returncode == 0
    r = mcbridge("verify", bucket, "--json", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [(c["prefix"], c["files"], c["ok"]) for c in report["copies"]] == [
        ("", 1, True), ("one/", 2, True), ("three/", 2, True), ("two/", 2, True)]
    assert report["checked"] == 7 and report["extra"] == [] and report["missing"] == []
    text = mcbridge("verify", bucket, env=emulator_env, state_dir=tmp_path)
    assert text.returncode == 0 and "in 4 committed copies" in text.stdout, text.stdout
    assert mcbridge("verify", f"{bucket}two/", env=emulator_env, state_dir=tmp_path).returncode == 0

    # an uncommitted object beside the copies, and a missing one inside one: both named
    (tmp_path / "stray").write_bytes(b"stray")
    from bridge.stores import get_store
    from tests.helpers import settings_for
    store = get_store(parse(bucket), settings_for(emulator_env))
    store.put(parse(f"{bucket}loose/stray"), b"stray", crc32c="00000000", metadata={})
    store.delete(parse(f"{bucket}three/b/x.bin"))
    bad = mcbridge("verify", bucket, "--json", env=emulator_env, state_dir=tmp_path)
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert report["extra"] == ["loose/stray"] and report["missing"] == ["three/b/x.bin"]
    # the stray object lies under the root's record (v.txt) and under no deeper one
    assert [c["ok"] for c in report["copies"]] == [False, True, False, True]


def test_a_no_op_sync_of_5000_s3_objects_sends_no_per_object_request(tmp_path):
    """S3 (``rclone serve s3``, whose listings carry no checksums) behind a proxy that logs every
    request: the no-op sync sends the listing's pages and nothing per object; a rewritten object
    costs requests for that object only."""
    from tests.emulators import RcloneS3, environment_for
    from tests.faultproxy import FaultProxy, proxied_environment
    with RcloneS3() as endpoint, FaultProxy(endpoint.endpoint) as proxy:
        endpoint.create_bucket("corpus")
        folder = endpoint.workdir / "data" / "corpus"
        for i in range(5000):    # written where the endpoint serves them from: quick to make
            (folder / f"d{i % 10}").mkdir(exist_ok=True)
            (folder / f"d{i % 10}" / f"{i:05d}.bin").write_bytes(b"%d" % i)
        env = proxied_environment(environment_for([endpoint]), {"s3": proxy})
        dst = tmp_path / "dst"
        first = mcbridge("sync", "s3://corpus/", f"{dst}/", "--json", env=env, state_dir=tmp_path)
        assert first.returncode == 0, first.stderr
        assert json.loads(first.stdout)["reasons"]["new"] == 5000

        proxy.log.clear()
        again = mcbridge("sync", "s3://corpus/", f"{dst}/", "--json", env=env, state_dir=tmp_path)
        assert again.returncode == 0, again.stderr
        out = json.loads(again.stdout)
        assert out["reasons"] == {"new": 0, "changed": 0, "repaired": 0, "unchanged": 5000, "adopted": 0}
        assert out["sent"] == []
        sent = [line for line, _ in proxy.log]
        per_object = [line for line in sent if line.split()[1].split("?")[0].strip("/") != "corpus"]
        assert per_object == [], per_object[:5]
        assert len(sent) <= 8, sent   # the listing's pages (5,000 keys: 5) and the bucket's check

        # one source object rewritten with other bytes: that object is read, and sent
        (folder / "d3" / "00003.bin").write_bytes(b"changed")
        proxy.log.clear()
        third = mcbridge("sync", "s3://corpus/", f"{dst}/", "--json", env=env, state_dir=tmp_path)
        assert third.returncode == 0, third.stderr
        assert json.loads(third.stdout)["sent"] == ["d3/00003.bin"]
        keys = {line.split()[1].split("?")[0] for line, _ in proxy.log}
        assert keys - {"/corpus", "/corpus/"} == {"/corpus/d3/00003.bin"}, keys
        assert (dst / "d3/00003.bin").read_bytes() == b"changed"


def _kinds(moto, since: int, bucket: str):
    """The requests moto logged since ``since`` (a length of its log), by bridge's request kinds."""
    from collections import Counter
    text = moto.log_path.read_text(errors="replace")[since:]
    kinds: Counter = Counter()
    for method, target in re.findall(r'"(GET|PUT|HEAD|POST|DELETE) ([^ ]+) HTTP/1\.1"', text):
        path, _, query = target.partition("?")
        if path.strip("/").split("/")[0] != bucket:
            continue
        whole_bucket = path.strip("/") == bucket
        args = {a.split("=")[0] for a in query.split("&") if a}
        if method == "GET":
            kinds["LIST" if whole_bucket else "GET"] += 1
        elif method == "PUT":
            kinds["PART" if "partNumber" in args else "PUT"] += 1
        elif method == "POST":
            kinds["BEGIN" if "uploads" in args else "COMPLETE"] += 1
        else:
            kinds[method] += 1
    return dict(kinds)


def test_dry_run_request_counts_equal_what_the_emulator_logs(moto, make_root, emulator_env, tmp_path):
    """cp, sync and migrate to S3: the requests ``--dry-run --json`` says the destination will
    get are the requests moto logs when the same command runs."""
    src = tmp_path / "src"
    for i in range(40):
        (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"d{i % 4}" / f"{i:03d}.bin").write_bytes(os.urandom(200 + i))
    (src / "big.bin").write_bytes(os.urandom(12 * 1024 * 1024 + 5))
    root = make_root("s3")
    bucket = parse(root).bucket

    def planned_then_ran(*args: str) -> tuple[dict, dict]:
        dry = mcbridge(*args, "--dry-run", "--json", env=emulator_env, state_dir=tmp_path)
        assert dry.returncode == 0, dry.stderr
        planned = json.loads(dry.stdout)["usage"]["destination"]["requests"]
        mark = len(moto.log_path.read_text(errors="replace"))
        run = mcbridge(*args, "-q", env=emulator_env, state_dir=tmp_path)
        assert run.returncode == 0, run.stderr
        time.sleep(0.2)   # moto writes its log line after the answer
        return planned, _kinds(moto, mark, bucket)

    planned, ran = planned_then_ran("cp", f"{src}/", f"{root}copy/", "--chunk-size", "5MiB")
    assert {k: v for k, v in planned.items() if v} == ran, (sorted(planned.items()), sorted(ran.items()))

    (src / "d1" / "new.bin").write_bytes(b"new")
    (src / "d2" / "002.bin").write_bytes(b"changed")
    planned, ran = planned_then_ran("sync", f"{src}/", f"{root}copy/", "--chunk-size", "5MiB")
    assert {k: v for k, v in planned.items() if v} == ran, (sorted(planned.items()), sorted(ran.items()))
    planned, ran = planned_then_ran("sync", f"{src}/", f"{root}copy/", "--chunk-size", "5MiB")   # no-op
    assert {k: v for k, v in planned.items() if v} == ran, (sorted(planned.items()), sorted(ran.items()))

    planned, ran = planned_then_ran("migrate", f"{src}/", f"{root}packed/", "--pack", "tar",
                                    "--shard-size", "64KiB")
    assert {k: v for k, v in planned.items() if v} == ran, (sorted(planned.items()), sorted(ran.items()))


def test_an_endpoint_keeping_no_checksums_is_proven_by_its_md5_etag_and_verified_from_the_listing(tmp_path):
    """rclone serve s3 keeps no checksum (so copies to it run with --store-checksums skip): a
    one-request upload's ETag is the MD5 of the bytes it stored, which bridge computes and
    records as the store's report when they agree; verify then passes the listed version with no
    request of its own (counted at a proxy: no HEAD, no GET of an object), and other bytes under
    the same name change the ETag and fail."""
    from tests.emulators import RcloneS3
    from tests.faultproxy import FaultProxy, proxied_environment
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.bin").write_bytes(os.urandom(1000 + i))
    with RcloneS3() as s3, FaultProxy(s3.endpoint) as proxy:
        s3.create_bucket("plain")
        env = proxied_environment({**os.environ, **s3.env()}, {"s3": proxy})
        dst = "s3://plain/copy/"
        r = mcbridge("cp", f"{src}/", dst, "--store-checksums", "skip", "-q", env=env, state_dir=tmp_path)
        assert r.returncode == 0, r.stderr
        proxy.configure()
        report = json.loads(mcbridge("verify", dst, "--json", env=env, state_dir=tmp_path).stdout)
        assert report["ok"] and report["checked"] == 5 and not report["rehashed"], report
        per_object = [line for line, _ in proxy.log if re.match(r"(HEAD|GET) /plain/copy/f\d", line)]
        assert not per_object, per_object
        client = s3.client()
        etag = client.head_object(Bucket="plain", Key="copy/f1.bin")["ETag"].strip('"')
        assert etag == hashlib.md5((src / "f1.bin").read_bytes()).hexdigest()
        client.put_object(Bucket="plain", Key="copy/f1.bin", Body=os.urandom(1001))
        r = mcbridge("verify", dst, env=env, state_dir=tmp_path)
        assert r.returncode == 1 and "mismatched  f1.bin: rewritten since the manifest was written" in r.stdout, \
            r.stdout + r.stderr
