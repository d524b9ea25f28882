"""The meter counts what was sent: each emulator's own request log (moto's, fake-gcs-server's,
Azurite's access lines) against what bridge's meter counted for the same copy, with a proxy in
front answering some requests 503 (those never reach the emulator; bridge sends them again).
Spend is then the price table applied to the metered counts and bytes."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.emulators import AZURITE_ACCOUNT, Azurite, FakeGCS, MotoServer, environment_for, unique_name
from tests.faultproxy import FaultProxy, proxied_environment
from bridge import meter, ops, pricing
from bridge.config import load_settings

pytestmark = pytest.mark.timeout(300)
MiB = 1024 * 1024
PRICES = Path(__file__).resolve().parent.parent / "policies" / "cost" / "prices"


class LoudGCS(FakeGCS):
    """fake-gcs-server with its access log on (the session's runs at warn)."""

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("-log-level") + 1] = "info"
        return command


EMULATORS = {"s3": MotoServer, "gs": LoudGCS, "az": Azurite}
# One access-log line per request each emulator answered, whatever the status (moto colours the
# 4xx and 5xx ones).
COLOUR = r"(?:\x1b\[[0-9;]*m)*"
ACCESS = re.compile(rf'"{COLOUR}(?P<method>[A-Z]+) (?P<target>/[^ "]*) HTTP/1\.1{COLOUR}\\?" (?P<status>\d{{3}})')


def access_lines(emulator, since: int, bucket: str) -> list[tuple[str, str]]:
    text = emulator.log_path.read_bytes()[since:].decode(errors="replace")
    out = []
    for m in ACCESS.finditer(text):
        if f"/{bucket}" in m["target"]:
            out.append((m["method"], m["target"]))
    return out


def tree(root: Path) -> int:
    total = 0
    for i in range(12):
        data = os.urandom(3000 + i)
        (root / f"small/{i:02d}.bin").parent.mkdir(parents=True, exist_ok=True)
        (root / f"small/{i:02d}.bin").write_bytes(data)
        total += len(data)
    big = os.urandom(12 * MiB + 5)   # parts of 5 MiB: the SDK's multipart path
    (root / "big.bin").write_bytes(big)
    return total + len(big)


def request_usd(scheme: str, kinds: Counter) -> float:
    """The price table's own numbers, read here without bridge: per kind, its class's price per 1,000."""
    table = yaml.safe_load((PRICES / {"s3": "aws.yaml", "gs": "gcp.yaml", "az": "azure.yaml"}[scheme]).read_text())
    classes, kind_class = table["requests"]["classes"], table["requests"]["kinds"]
    return sum(classes[kind_class[kind]]["usd"] * n / 1000.0 for kind, n in kinds.items())


@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_metered_requests_are_the_emulators_own_log_with_503s_retried(scheme, tmp_path):
    with EMULATORS[scheme]() as emulator:
        bucket = unique_name()
        emulator.create_bucket(bucket)
        with FaultProxy(emulator.endpoint) as proxy:
            env = proxied_environment(environment_for([emulator]), {scheme: proxy})
            env["MCBRIDGE_STATE_DIR"] = str(tmp_path / "state")
            settings = load_settings({"transfer": {"chunk_size": 5 * MiB}}, environ=env)
            src = tmp_path / "src"
            size = tree(src)
            back = tmp_path / "back"
            back.mkdir()

            proxy.configure(error_rate=0.2, seed=7)
            since = emulator.log_path.stat().st_size
            with meter.metering(meter.Meter()) as up:
                summary = ops.copy(f"{src}/", f"{scheme}://{bucket}/m/", settings)
            with meter.metering(meter.Meter()) as down:
                ops.copy(f"{scheme}://{bucket}/m/", f"{back}/", settings)
            logged = access_lines(emulator, since, bucket)

            errors = proxy.counts["error"]
            assert errors >= 5 and summary["retries"] >= 1        # the faults were there, and retried
            sent = up.request_count + down.request_count
            # every request bridge sent went through the proxy; those it did not answer 503 reached the emulator
            assert sent == proxy.counts["requests"]
            assert sent == len(logged) + errors, (sent, len(logged), errors)
            for m in (up, down):
                assert set(m.stores) == {f"{scheme}://{bucket}"}
            # the answers' bodies, as the proxy sent them on (a HEAD's Content-Length is the
            # object's size, not a body: no byte of it crossed the wire)
            received = sum(r.bytes_received for m in (up, down) for r in m.stores.values())
            assert received == proxy.counts["bytes_down"], (received, proxy.counts["bytes_down"])

            # uploads of data (parts; on GCS every object write, parts included, is one upload):
            # as many as the emulator logged plus the ones answered 503
            kinds = ("PUT", "PART") if scheme == "gs" else ("PART",)
            writes_logged = sum(1 for method, target in logged if _is_write(scheme, method, target))
            writes_503 = sum(1 for line, action in proxy.log
                             if action == "error" and _is_write(scheme, *line.split(" ", 1)))
            counted = up.stores[f"{scheme}://{bucket}"].requests
            assert sum(counted[k] for k in kinds) == writes_logged + writes_503 >= 3
            if scheme == "gs":   # a part's upload names a temporary object: a PART, as estimated
                assert counted["PART"] >= 3, counted

            row = down.stores[f"{scheme}://{bucket}"]
            assert row.bytes_read >= size        # data read back, re-reads of a cut answer included
            # Each kind as classify() names the request lines the proxy saw, one by one: the same
            # counts as the meter's, whose small-file batches classify a bucket's requests once
            # per connection (bridge.stores.streams.Link.send's ``alike``).
            base = "/" + AZURITE_ACCOUNT if scheme == "az" else ""
            one_by_one = Counter(meter.classify(scheme, *line.split(" ", 1), base=base, host="127.0.0.1")[1]
                                 for line, _action in proxy.log)
            assert +(counted + down.stores[f"{scheme}://{bucket}"].requests) == one_by_one

            proxy.configure()   # no more faults: pricing looks up where the bucket is
            # spend: the price table applied to what was metered (local source and destination:
            # no egress but from the store to this site)
            settings_site = load_settings({"pricing": {"runs_in": "site:lab"}}, environ=env)
            up_usd = pricing.spend(up, f"{src}/", f"{scheme}://{bucket}/m/", settings_site)
            assert up_usd == pytest.approx(request_usd(scheme, up.stores[f"{scheme}://{bucket}"].requests), rel=1e-9)
            down_usd = pricing.spend(down, f"{scheme}://{bucket}/m/", f"{back}/", settings_site)
            assert down_usd > request_usd(scheme, row.requests) > 0   # and the egress of the bytes read


def _is_write(scheme: str, method: str, target: str) -> bool:
    """Read off the request line without bridge: an S3 UploadPart, an Azure Put Block, a GCS upload."""
    if scheme == "s3":
        return method == "PUT" and "partNumber=" in target
    if scheme == "az":
        return method == "PUT" and "comp=block" in target and "comp=blocklist" not in target
    return method == "POST" and target.startswith("/upload/")


@pytest.mark.parametrize("host, path, bucket", [
    ("corpus.s3.amazonaws.com", "/a/b.bin", "corpus"),
    ("corpus.s3.eu-west-1.amazonaws.com", "/a/b.bin", "corpus"),
    ("corpus.s3-eu-west-1.amazonaws.com", "/a/b.bin", "corpus"),
    ("my.dotted.bucket.s3.us-east-1.amazonaws.com", "/a/b.bin", "my.dotted.bucket"),
    ("corpus.s3.cn-north-1.amazonaws.com.cn", "/a/b.bin", "corpus"),
    ("s3.eu-west-1.amazonaws.com", "/corpus/a/b.bin", "corpus"),
    ("bucket.vpce-1a2b3c4d-5e6f.s3.us-east-1.vpce.amazonaws.com", "/corpus/a/b.bin", "corpus"),
    ("127.0.0.1", "/corpus/a/b.bin", "corpus"),
])
def test_an_s3_request_is_counted_against_the_bucket_its_host_or_its_path_names(host, path, bucket):
    from bridge.meter import classify
    assert classify("s3", "GET", path, {}, host=host) == (f"s3://{bucket}", "GET")


def test_a_meter_hands_each_count_ahead_and_drains_only_what_was_not_kept():
    """A worker's meter (workers/metering.py) hands each count to Redis as it is made; what Redis
    did not take stays in the meter and is handed over when the task ends, never twice."""
    kept: Counter = Counter()
    down = []

    def ahead(fields: dict[str, int]) -> bool:
        if down:
            return False
        kept.update(fields)
        return True

    m = meter.Meter(ahead=ahead)
    m.request("s3://b", "PART", 5 * MiB)
    m.answer("s3://b", "PART", 200, 0)
    m.request("s3://b", "GET")
    m.answer("s3://b", "GET", 200, 100)
    assert dict(kept) == {"s3://b|req.PART": 1, "s3://b|bytes_sent": 5 * MiB, "s3://b|req.GET": 1,
                          "s3://b|bytes_received": 100, "s3://b|bytes_read": 100}
    down.append(True)   # Redis stops answering
    m.request("s3://b", "PUT", 3)
    m.answer("s3://b", "PUT", 503, 20)
    assert m.to_dict()["s3://b"]["requests"] == {"GET": 1, "PART": 1, "PUT": 1}   # the meter has it all
    assert m.drain() == {"s3://b|req.PUT": 1, "s3://b|bytes_sent": 3, "s3://b|bytes_received": 20,
                         "s3://b|errors": 1}
    assert m.drain() == {} and m.to_dict() == {}
