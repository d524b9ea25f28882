"""The status page (mcbridge status serve) as a browser sees it: Debian's Chromium, headless,
opens it while a real job runs on a real worker (moto, Redis) and a policy lags behind its
source; the DOM shows the job's progress, the lagging policy and the budget, and a screenshot is
kept (tests/artifacts/status-page.png). Without the token the page answers 401, and nothing but
GET and HEAD is answered at all."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.emulators import unique_name
from tests.test_service_policies import _put_checkpoint
from tests.test_workers_service import service  # noqa: F401  (the fixture)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="needs Debian's chromium (scripts/test.sh)")]


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """One headless Chromium run of ``url`` with a fresh profile: nothing fetched but the page."""
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
                           "--window-size=1280,900", *args, url],
                          capture_output=True, text=True, timeout=120)


def status_server(service, tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """``mcbridge status serve`` on a free loopback port; (its process, the page's URL)."""
    process = subprocess.Popen([sys.executable, "-m", "bridge", "status", "serve", "--bind", "127.0.0.1:0", *args],
                               env=service.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:
        found = re.search(r"status page at (http://\S+)", line)
        if found:
            return process, found.group(1)
    raise AssertionError(f"status serve exited {process.wait()}: {process.stderr.read()}")


def fetch(url: str, method: str = "GET", token: str | None = None) -> tuple[int, dict, str]:
    request = urllib.request.Request(url, method=method,
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read().decode()


class _Kept(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None   # the redirect itself is the answer


def fetch_once(url: str) -> tuple[int, dict, str]:
    """A GET whose redirect is not followed."""
    try:
        with urllib.request.build_opener(_Kept).open(url, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as answer:
        return answer.code, dict(answer.headers), answer.read().decode()


def test_the_status_page_shows_a_running_job_a_lagging_policy_and_the_budget_in_chromium(service, moto, fake_gcs,  # noqa: F811
                                                                                          tmp_path):
    # a policy whose one destination verified step-1; step-2 is committed at the source since
    src, gbucket, out = unique_name(), unique_name(), unique_name()
    for bucket in (src, out):
        moto.create_bucket(bucket)
    fake_gcs.create_bucket(gbucket)
    _put_checkpoint(moto, src, "step-1")
    policy_file = tmp_path / "policies.yaml"
    policy_file.write_text(f"""\
policies:
  golden:
    source: s3://{src}/golden/
    destinations: [gs://{gbucket}/dr/]
    checkpoints: "step-*"
    keep_last: 2
    verify: store
""")
    ran = service.cli("replicate", "--policy", str(policy_file), "--once")
    assert ran.returncode == 0, ran.stderr
    _put_checkpoint(moto, src, "step-2")
    assert service.cli("budgets", "set", "golden", "3").returncode == 0
    # this machine's cache: step-1's shards filled, one of them asked for again (a hit)
    service.env["MCBRIDGE_CACHE_DIR"] = str(tmp_path / "cache")
    assert service.cli("cache", "warm", f"s3://{src}/golden/step-1/", "--include", "shard-*").returncode == 0
    assert service.cli("cache", "path", f"s3://{src}/golden/step-1/shard-0.bin").returncode == 0

    # a job that runs for a while (6 MiB at 128 KiB/s: 48 s, cancelled once looked at) to a
    # prefix whose name is HTML
    data = tmp_path / "data"
    data.mkdir()
    for i in range(24):   # small files: the job's progress is counted as each one lands
        (data / f"part-{i:02d}.bin").write_bytes(os.urandom(256 * 1024))
    dst = f"s3://{out}/run-<b>&x</b>/"
    service.worker("w1", concurrency=1).wait_ready()
    job_id = service.submit("cp", f"{data}/", dst, "--bwlimit", "128KiB")
    record = service.wait(job_id, states=("running",))
    deadline = time.monotonic() + 60
    while (record.counters.get("bytes_done", 0) == 0 and record.state == "running" and time.monotonic() < deadline):
        time.sleep(0.2)
        record = service.jobs.get(job_id)
    assert record.state == "running" and record.counters.get("bytes_done", 0) > 0, record

    token_file = tmp_path / "status-token"
    server, url = status_server(service, tmp_path, "--policies", str(policy_file), "--token-file", str(token_file))
    try:
        token = token_file.read_text().strip()
        assert token_file.stat().st_mode & 0o077 == 0 and len(token) == 64
        # a browser: the token once in the address, then a cookie; the DOM as rendered
        dom = chromium(f"{url}?token={token}", tmp_path / "chrome-dom", "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        page = dom.stdout
        job_row = re.search(rf'<tr class="job" id="job-{job_id}">(.*?)</tr>', page, re.S)
        assert job_row, page[:3000]
        row = job_row.group(1)
        assert ">running<" in row and re.search(r"\d+%: [\d.]+ (B|KiB|MiB) of 6\.0 MiB, \d+/24 files, [\d.]+ (B|KiB)/s", row), row
        assert "<svg" in row and "&lt;b&gt;&amp;x&lt;/b&gt;" in row and "<b>" not in row   # escaped, not markup
        policy = re.search(r'<div class="policy" id="policy-golden">(.*?)</div>', page, re.S).group(1)
        assert '<tr class="lagging">' in policy and "1 checkpoint behind step-2" in policy
        assert "step-1" in policy and "1 behind" in policy   # the lag chart's bar
        budget = re.search(r'<tr id="budget-golden">(.*?)</tr>', page, re.S).group(1)
        assert "$3.00" in budget, budget
        assert "<script" not in page
        assert "2 entries" in page and "1 hit (" in page and "2 misses" in page, page[page.find('id="cache"'):]

        # what a person would see, kept
        shot = tmp_path / "status-page.png"
        taken = chromium(f"{url}?token={token}", tmp_path / "chrome-shot", f"--screenshot={shot}")
        assert taken.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", taken.stderr[-2000:]
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(shot, ARTIFACTS / "status-page.png")
        print(f"status page screenshot: {ARTIFACTS / 'status-page.png'}")

        # without the token, or with another: 401; read-only: nothing but GET and HEAD
        assert fetch(url)[0] == 401
        assert fetch(f"{url}?token={'0' * 64}")[0] == 401
        assert fetch(url, token="x" * 64)[0] == 401
        status, headers, body = fetch(url, token=token)
        assert status == 200 and job_id in body and "script-src" not in headers["Content-Security-Policy"]
        assert fetch(url, "HEAD", token=token)[0] == 200
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, headers, _ = fetch(url, method, token=token)
            assert status == 405 and headers["Allow"] == "GET, HEAD", method
        # the token in an address, once: a cookie, and back to the page itself whatever the path
        status, headers, _ = fetch_once(f"{url}/%2F%2Fexample.org/?token={token}")
        assert status == 303 and headers["Location"] == "/", headers
        assert headers["Set-Cookie"] == f"mcbridge_status={token}; Path=/; HttpOnly; SameSite=Strict"
        cookie = urllib.request.Request(url, headers={"Cookie": f"mcbridge_status={token}"})
        with urllib.request.urlopen(cookie, timeout=30) as answer:
            assert answer.status == 200 and job_id in answer.read().decode()
        assert service.jobs.get(job_id).state != "cancelled"   # the page changed nothing
    finally:
        server.terminate()
        server.wait(timeout=30)
        service.cli("jobs", "cancel", job_id)   # its worker stops at once, not at the end of its task


def test_status_serve_refuses_bad_input_on_one_line(service, tmp_path):  # noqa: F811
    shared = tmp_path / "shared-token"
    shared.write_text("a" * 64)
    shared.chmod(0o644)
    for args, words in ((["--bind", "nonsense"], "--bind 'nonsense': use HOST:PORT"),
                        (["--bind", "127.0.0.1:99999"], "use HOST:PORT"),
                        (["--token-file", str(shared), "--bind", "127.0.0.1:0"], "is readable by others: chmod 600"),
                        (["--policies", str(tmp_path / "nope.yaml"), "--bind", "127.0.0.1:0"], "no such file")):
        r = service.cli("status", "serve", *args, timeout=60)
        assert r.returncode != 0 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_everything_a_user_or_a_store_named_is_text_on_the_page_never_markup():
    """Job ids, URLs, policy, budget and tenant names, errors, checkpoint names: rendered as text
    (an HTML parser finds no element but the page's own)."""
    from html.parser import HTMLParser

    from bridge.workers.statuspage import render
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'&"
    numbers = {"bytes": 1, "bytes_total": 2, "fraction": 0.5, "files_done": 1, "files_total": 2,
               "rate_bytes_per_s": 1.0, "eta_s": 1.0}
    page = {"month": "2026-12", "namespace": evil, "budgets": {evil: {"limit_usd": 1.0, "spent_usd": 0.5,
                                                                      "reserved_usd": 0.1}},
            "jobs": [{"id": evil, "kind": evil, "state": evil, "active": True, "tenant": evil, "source": evil,
                      "destinations": [evil], "route": evil, "schedule": evil, "policy": evil, "created": evil,
                      "spent_usd": None, "estimate_usd": 0.1, "budget": evil, "errors": [evil], "progress": numbers}],
            "policies": [{"name": evil, "source": evil, "source_error": evil, "budget_usd": None, "spent_usd": 0.0,
                          "waiting": {evil: evil}, "trusted": {evil: evil},
                          "destinations": [{"destination": evil, "last_run": evil, "job": evil, "ok": False,
                                            "newest_verified": evil, "verified_at": evil, "newest_source": evil,
                                            "lag_checkpoints": 2, "commit_to_verified_s": None, "spent_usd": 0.0,
                                            "errors": [evil]}]}],
            "policies_note": evil, "cache": None, "cache_note": evil}

    class Elements(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.attributes = set(), set()

        def handle_starttag(self, tag, attrs):
            self.tags.add(tag)
            self.attributes.update(name for name, _ in attrs)

    parsed = Elements()
    text = render(page)
    parsed.feed(text)
    assert "script" not in parsed.tags and "img" not in parsed.tags and "onerror" not in parsed.attributes
    assert text.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 20, text
