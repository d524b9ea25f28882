"""The status page: one read-only HTML page of what the service is doing, for a browser.

    GET /          jobs (progress bar, route, spend), policies (per destination: within its RPO
                   or past it, and a chart of its lag over the service's last runs),
                   budgets (limit, spent, reserved), the cache
    GET /healthz   "ok" (no token needed: it says nothing but that the page answers)

Nothing is read here that the commands do not read: the jobs through the records ``jobs list``
reads and ``jobs watch``'s progress numbers, the policies through ``policy status``'s report,
the budgets as ``budgets list`` reads them, the cache through ``Cache.stat`` as ``cache stat``
does. They are read again at most every few seconds, however many viewers there are (``Fresh``:
listing a policy's source is a billed request); the page refreshes itself (a meta refresh).

Read-only: only GET and HEAD are answered, anything else is 405, and no handler writes to Redis
or a store (the cache's folders are made if missing, as ``cache stat`` makes them). Behind a
token: ``Authorization: Bearer TOKEN``, or a cookie that ``/?token=TOKEN`` sets once, redirecting
to the page without it (so a browser can open it); without the token, 401. The token is a secret
of the kind tenant keys are (32 random bytes as hex, in a file only its owner can read;
workers/auth.py). Everything a user or a store named (job ids, URLs, policy and budget names,
errors) is escaped before it is written into the HTML; the charts are inline SVG drawn here, and
the page's Content-Security-Policy allows no script at all.
"""

from __future__ import annotations

import hmac
import html
import threading
import time
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from bridge.policies.cost.money import usd
from bridge.policies.replication import rpo_words
from bridge.progress import human_bytes, human_duration, plural

COOKIE = "mcbridge_status"
REFRESH_S = 5
JOBS_SHOWN = 30
# No script, no frame, nothing loaded from elsewhere: inline styles and the page's own SVG only.
HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
                                      "frame-ancestors 'none'; form-action 'none'; base-uri 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
           "X-Frame-Options": "DENY"}


def e(value: Any) -> str:
    """Text of ``value`` safe inside HTML, in an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


# -- what the page shows, read as the commands read it --------------------------------------------

def gather(ws, settings, policies: Path | None) -> dict[str, Any]:
    """Everything the page shows, as plain data; a part that cannot be read says why instead."""
    from bridge.errors import BridgeError
    from bridge.policies.cost.budgets import month
    from bridge.workers.redisbudgets import Budgets
    from bridge.workers.commands.connection import job_records
    from bridge.workers.commands.job_control import progress_numbers
    jobs = job_records(ws)
    rows = []
    for record in jobs.list(JOBS_SHOWN):
        if record.parent:   # a replication's destination: shown inside its parent's progress
            continue
        doc = record.to_dict()
        rows.append({"id": record.id, "kind": record.kind, "state": record.state, "active": record.active,
                     "tenant": record.tenant,
                     "source": record.spec.get("source", ""), "destinations": record.spec.get("destinations", []),
                     "route": (doc["route"] or {}).get("name"), "schedule": record.schedule,
                     "policy": record.policy, "created": doc["created"],
                     "spent_usd": record.spent_usd, "estimate_usd": record.estimate_usd, "budget": record.budget,
                     "errors": record.errors[:3], "progress": progress_numbers(jobs, record)})
    page: dict[str, Any] = {"month": month(), "namespace": ws.namespace, "jobs": rows,
                            "budgets": Budgets(jobs.r, jobs.keys).all()}
    if policies is None:
        page["policies"], page["policies_note"] = [], "no policy file: give --policies or set BRIDGE_POLICIES"
    else:
        from bridge.workers.commands.policy_state import policy_report
        try:
            page["policies"], page["policies_note"] = policy_report(ws, policies, None, settings), None
        except BridgeError as exc:
            page["policies"], page["policies_note"] = [], f"{policies}: {exc}"
    try:
        from bridge.cache.core import Cache
        page["cache"], page["cache_note"] = Cache(settings).stat(), None
    except (BridgeError, OSError) as exc:
        page["cache"], page["cache_note"] = None, str(exc)
    return page


# -- drawing ---------------------------------------------------------------------------------------

def bar_svg(fraction: float | None, label: str, width: int = 220, colour: str = "#2f7d32",
            over: float | None = None) -> str:
    """A horizontal bar, ``fraction`` of it filled (an indeterminate stripe when None); ``over``:
    a second, lighter segment after the first (a budget's reservations after its spend)."""
    h = 14
    parts = [f'<svg class="bar" width="{width}" height="{h}" viewBox="0 0 {width} {h}" role="img" '
             f'aria-label="{e(label)}"><rect width="{width}" height="{h}" rx="3" fill="#e4e7eb"/>']
    if fraction is None:
        parts.append(f'<rect width="{width}" height="{h}" rx="3" fill="url(#stripe)" opacity="0.5"/>')
    else:
        filled = round(width * max(0.0, min(1.0, fraction)))
        parts.append(f'<rect width="{filled}" height="{h}" rx="3" fill="{colour}"/>')
        if over:
            extra = round(width * max(0.0, min(1.0 - min(1.0, fraction), over)))
            parts.append(f'<rect x="{filled}" width="{extra}" height="{h}" fill="{colour}" opacity="0.35"/>')
    parts.append("</svg>")
    return "".join(parts)


def lag_chart_svg(rows: list[tuple[str, int | None]], width: int = 560) -> str:
    """One bar per destination: how many committed checkpoints it is behind its source (red when
    behind, a dash when not known)."""
    label_w, row_h, pad = 260, 22, 4
    rows = [(name, lag if isinstance(lag, int) else None) for name, lag in rows]
    most = max([lag for _, lag in rows if lag is not None] + [1])
    scale = (width - label_w - 60) / most
    height = row_h * len(rows) + 2 * pad
    out = [f'<svg class="lag" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="checkpoints behind, per destination">']
    for i, (name, lag) in enumerate(rows):
        y = pad + i * row_h
        shown = name if len(name) <= 38 else "\u2026" + name[-37:]
        out.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end" font-size="12">{e(shown)}</text>')
        if lag is None:
            out.append(f'<text x="{label_w + 4}" y="{y + 15}" font-size="12" fill="#777">not known</text>')
            continue
        w = max(2, round(lag * scale))
        colour = "#c62828" if lag else "#2f7d32"
        out.append(f'<rect x="{label_w}" y="{y + 3}" width="{w}" height="{row_h - 6}" rx="2" fill="{colour}"/>')
        out.append(f'<text x="{label_w + w + 6}" y="{y + 15}" font-size="12">{lag} behind</text>')
    out.append("</svg>")
    return "".join(out)


SERIES_COLOURS = ("#1565c0", "#c62828", "#2f7d32", "#8e24aa", "#ef6c00", "#00838f")


def lag_history_svg(series: list[tuple[str, list[dict[str, Any]]]], width: int = 560, height: int = 150) -> str:
    """Lag over time: per destination, a line through the samples its policy's runs left (when
    each ended, how many committed checkpoints it was behind; workers/replicas.py), a dot per
    sample, the time axis shared by all. A sample whose lag is not known is left out."""
    left, right, top, bottom, legend_h = 34, 12, 10, 22, 18
    drawn = [(name, [(float(s["at"]), s["lag"]) for s in samples if isinstance(s.get("lag"), int)])
             for name, samples in series]
    times = [at for _, points in drawn for at, _ in points]
    first, last = (min(times), max(times)) if times else (0.0, 0.0)
    most = max([lag for _, points in drawn for _, lag in points] + [1])
    plot_w, plot_h = width - left - right, height - top - bottom
    full_h = height + legend_h * len(drawn)

    def x(at: float) -> float:
        return left + (plot_w / 2 if last == first else (at - first) / (last - first) * plot_w)

    def y(lag: int) -> float:
        return top + plot_h - lag / most * plot_h

    out = [f'<svg class="lag-history" width="{width}" height="{full_h}" viewBox="0 0 {width} {full_h}" role="img" '
           f'aria-label="checkpoints behind over time, per destination">',
           f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#8c959f"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#8c959f"/>',
           f'<text x="{left - 4}" y="{top + 4}" text-anchor="end" font-size="11">{most}</text>',
           f'<text x="{left - 4}" y="{top + plot_h + 4}" text-anchor="end" font-size="11">0</text>']
    if times:
        for at, anchor in ((first, "start"), (last, "end")) if last != first else ((first, "middle"),):
            out.append(f'<text x="{x(at):.1f}" y="{height - 6}" text-anchor="{anchor}" font-size="11">'
                       f'{time.strftime("%m-%d %H:%M", time.gmtime(at))}</text>')
    for i, (name, points) in enumerate(drawn):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        out.append(f'<g class="lag-series" aria-label="{e(name)}">')
        if len(points) > 1:
            line = " ".join(f"{x(at):.1f},{y(lag):.1f}" for at, lag in points)
            out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out.extend(f'<circle class="lag-point" cx="{x(at):.1f}" cy="{y(lag):.1f}" r="3" fill="{colour}">'
                   f'<title>{lag} behind at {time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))}</title></circle>'
                   for at, lag in points)
        ly = height + i * legend_h + 12
        shown = name if len(name) <= 60 else "\u2026" + name[-59:]
        now = f"{points[-1][1]} behind at the last run" if points else "no run recorded"
        out.append(f'<rect x="{left}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>'
                   f'<text x="{left + 16}" y="{ly}" font-size="12">{e(shown)}: {e(now)}</text></g>')
    out.append("</svg>")
    return "".join(out)


def _job_row(job: dict[str, Any]) -> str:
    p = job["progress"]
    pct = f"{100 * p['fraction']:.0f}%" if p["fraction"] is not None else "-"
    eta = f", ETA {human_duration(p['eta_s'])}" if p["eta_s"] is not None else ""
    colour = {"failed": "#c62828", "cancelled": "#777", "succeeded": "#2f7d32"}.get(job["state"], "#1565c0")
    progress = (f"{bar_svg(p['fraction'], pct, colour=colour)}<div class=\"small\">{e(pct)}: "
                f"{e(human_bytes(p['bytes']))} of {e(human_bytes(p['bytes_total']))}, "
                f"{p['files_done']}/{p['files_total']} files, {e(human_bytes(p['rate_bytes_per_s']))}/s{e(eta)}</div>")
    spend = (usd(job["spent_usd"]) if job["spent_usd"] is not None
             else f"~{usd(job['estimate_usd'])} estimated" if job["estimate_usd"] is not None else "-")
    tags = "".join(f' <span class="tag">{e(t)}</span>' for t in (
        f"policy {job['policy']}" if job["policy"] else None, f"schedule {job['schedule']}" if job["schedule"] else None,
        f"budget {job['budget']}" if job["budget"] else None, f"tenant {job['tenant']}" if job["tenant"] else None) if t)
    errors = "".join(f'<div class="err">{e(msg)}</div>' for msg in job["errors"])
    return (f'<tr class="job" id="job-{e(job["id"])}"><td><code>{e(job["id"])}</code><div class="small">'
            f'{e(job["created"])}</div></td><td>{e(job["kind"])}</td>'
            f'<td class="state state-{e(job["state"])}">{e(job["state"])}</td><td>{progress}</td>'
            f'<td><code>{e(job["source"])}</code> &rarr; {", ".join(f"<code>{e(d)}</code>" for d in job["destinations"])}'
            f'<div class="small">route {e(job["route"] or "-")}{tags}</div>{errors}</td>'
            f'<td class="num">{e(spend)}</td></tr>')


def _policy_block(p: dict[str, Any]) -> str:
    cap = usd(p["budget_usd"]) if p["budget_usd"] is not None else "no monthly budget"
    rows = []
    for row in p["destinations"]:
        lag = row["lag_checkpoints"]
        if row["last_run"] is None:
            state = "never run"
        else:
            state = ("ok" if row["ok"] else "FAILED") + f", last run {row['last_run']}"
        behind = "up to date" if lag == 0 else "not known" if lag is None else \
            f"{lag} checkpoint{'s' if lag != 1 else ''} behind {row['newest_source']}"
        c2v = f"{row['commit_to_verified_s']}s" if row.get("commit_to_verified_s") is not None else "-"
        lagging = ' class="lagging"' if lag else ""
        rpo = f'<td class="rpo{" err" if row.get("within") is False else ""}">{e(rpo_words(row))}</td>' \
            if "rpo" in row else "<td>-</td>"
        rows.append(f"<tr{lagging}><td><code>{e(row['destination'])}</code></td><td>{e(state)}</td>"
                    f"<td>{e(row['newest_verified'] or '-')}</td><td>{e(behind)}</td>{rpo}<td class=\"num\">{e(c2v)}</td>"
                    f"<td class=\"num\">{e(usd(row['spent_usd']))}</td></tr>"
                    + "".join(f'<tr><td></td><td colspan="6" class="err">{e(x)}</td></tr>' for x in row["errors"]))
    notes = "".join(f'<div class="small">{e(ck)} waiting: {e(why)}</div>' for ck, why in p["waiting"].items())
    notes += "".join(f'<div class="small">{e(ck)} committed on trust: {e(why)}</div>' for ck, why in p["trusted"].items())
    if p["source_error"]:
        notes += f'<div class="err">source not listed: {e(p["source_error"])}</div>'
    # lag over time from the service's runs; where none left a sample (runs made in-process
    # only), the lag of the newest run, one bar per destination
    if any(row.get("lag_history") for row in p["destinations"]):
        chart = lag_history_svg([(row["destination"], row["lag_history"]) for row in p["destinations"]])
    else:
        chart = lag_chart_svg([(row["destination"], row["lag_checkpoints"]) for row in p["destinations"]])
    return (f'<div class="policy" id="policy-{e(p["name"])}"><h3>{e(p["name"])} <span class="small">'
            f'<code>{e(p["source"])}</code>: {e(usd(p["spent_usd"]))} spent of {e(cap)}</span></h3>{notes}'
            f'<table><tr><th>destination</th><th>last run</th><th>newest verified</th><th>lag</th><th>RPO</th>'
            f'<th>commit to verified</th><th>this month</th></tr>{"".join(rows)}</table>{chart}</div>')


def _budget_row(name: str, row: dict[str, float | None]) -> str:
    limit, spent, held = row["limit_usd"], row["spent_usd"] or 0.0, row["reserved_usd"] or 0.0
    if limit:
        fraction, over = spent / limit, held / limit
        share = f"{100 * (spent + held) / limit:.0f}% of the limit spent or reserved"
        colour = "#c62828" if spent + held >= limit else "#ef6c00" if spent + held >= 0.8 * limit else "#2f7d32"
        chart = bar_svg(fraction, share, colour=colour, over=over) + f'<div class="small">{e(share)}</div>'
    else:
        chart = '<span class="small">no limit</span>'
    return (f'<tr id="budget-{e(name)}"><td>{e(name)}</td><td class="num">{e(usd(limit) if limit is not None else "none")}'
            f'</td><td class="num">{e(usd(spent))}</td><td class="num">{e(usd(held))}</td><td>{chart}</td></tr>')


def _cache_block(c: dict[str, Any] | None, note: str | None) -> str:
    if c is None:
        return f'<p class="err">{e(note)}</p>'
    looked = c["hits"] + c["misses"]
    ratio = c["hits"] / looked if looked else None
    used = f"{human_bytes(c['bytes'])} of quota {human_bytes(c['quota']) if c['quota'] else 'none'}"
    return (f'<p><code>{e(c["dir"])}</code> on {e(c["host"])}: {plural(c["entries"], "entry", "entries")}, '
            f'{e(used)}; {c["pinned"]} pinned, {c["filling"]} filling</p>'
            f'<p>{bar_svg(c["bytes"] / c["quota"] if c["quota"] else None, used)} used</p>'
            f'<p>{bar_svg(ratio, "hit ratio")} hit ratio {e(f"{100 * ratio:.0f}%" if ratio is not None else "-")}: '
            f'{plural(int(c["hits"]), "hit")} ({int(c["waits"])} waited for a fill), '
            f'{plural(int(c["misses"]), "miss", "misses")}; {e(human_bytes(c["bytes_filled"]))} filled in '
            f'{c["fill_seconds"]:.1f}s; {plural(int(c["evictions"]), "eviction")} ({e(human_bytes(c["bytes_evicted"]))}); '
            f'{int(c["corrupted"])} corrupted removed</p>')


STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:16px 24px;color:#1f2328}h1{font-size:20px;margin:0}
h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #d0d7de}h3{font-size:14px;margin:12px 0 4px}
table{border-collapse:collapse;width:100%}td,th{padding:4px 8px;border-bottom:1px solid #eaeef2;text-align:left;
vertical-align:top}.num{text-align:right;white-space:nowrap}.small{font-size:12px;color:#57606a}
.err{color:#c62828;font-size:12px}.tag{background:#eaeef2;border-radius:3px;padding:0 4px}
.lagging td{background:#fff4f4}.state-running{color:#1565c0;font-weight:600}.state-failed{color:#c62828}
code{font-size:12px;word-break:break-all}svg.bar{vertical-align:middle}"""


def render(page: dict[str, Any], now: float | None = None) -> str:
    """The page's HTML: every value a user or a store named escaped (``e``)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now or time.time()))
    jobs = "".join(_job_row(j) for j in page["jobs"]) or '<tr><td colspan="6">no jobs</td></tr>'
    policies = "".join(_policy_block(p) for p in page["policies"])
    if page["policies_note"]:
        policies += f'<p class="small">{e(page["policies_note"])}</p>'
    budgets = "".join(_budget_row(n, r) for n, r in page["budgets"].items()) or '<tr><td colspan="5">no budgets</td></tr>'
    active = sum(1 for j in page["jobs"] if j["active"])
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="{REFRESH_S}">
<title>mcbridge status: {e(page['namespace'])}</title><style>{STYLE}</style></head><body>
<svg width="0" height="0" style="position:absolute"><defs><pattern id="stripe" width="8" height="8"
patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="4" height="8" fill="#8c959f"/></pattern></defs></svg>
<h1>mcbridge status</h1><div class="small">namespace <code>{e(page['namespace'])}</code>, {when},
{active} active of {len(page['jobs'])} jobs shown; read-only, refreshed every {REFRESH_S}s</div>
<h2 id="jobs">Jobs</h2><table><tr><th>job</th><th>kind</th><th>state</th><th>progress</th><th>route</th>
<th class="num">spend</th></tr>{jobs}</table>
<h2 id="policies">Policies</h2>{policies}
<h2 id="budgets">Budgets ({e(page['month'])})</h2><table><tr><th>budget</th><th class="num">limit</th>
<th class="num">spent</th><th class="num">reserved</th><th>used</th></tr>{budgets}</table>
<h2 id="cache">Cache</h2>{_cache_block(page['cache'], page['cache_note'])}
</body></html>
"""


# -- serving ---------------------------------------------------------------------------------------

class StatusServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], token: str, page: Callable[[], str]):
        self.token = token.encode()
        self.page = page
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    server: StatusServer
    server_version = "mcbridge-status"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:   # no access log: a URL may carry the token
        pass

    def _send(self, status: int, body: str, content_type: str = "text/plain; charset=utf-8",
              extra: dict[str, str] | None = None) -> None:
        data = body.encode()
        self.send_response(status)
        for name, value in {**HEADERS, "Content-Type": content_type, "Content-Length": str(len(data)),
                            **(extra or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _given(self) -> tuple[bytes | None, bool]:
        """The token the request carries (header, cookie or query) and whether it came in the query."""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return auth[7:].strip().encode(), False
        query = parse_qs(urlsplit(self.path).query).get("token")
        if query:
            return query[0].encode(), True
        try:
            morsel = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
        except CookieError:
            morsel = None
        return (morsel.value.encode() if morsel else None), False

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/healthz":
            return self._send(HTTPStatus.OK, "ok\n")
        token, in_query = self._given()
        if token is None or not hmac.compare_digest(token, self.server.token):
            return self._send(HTTPStatus.UNAUTHORIZED, "401: this page needs its token (Authorization: Bearer "
                              "TOKEN, or open /?token=TOKEN once)\n", extra={"WWW-Authenticate": 'Bearer realm="mcbridge"'})
        if in_query:   # once: a cookie for the browser, and the token out of its address bar and history
            return self._send(HTTPStatus.SEE_OTHER, "", extra={   # to the page itself, never a path given
                "Location": "/", "Set-Cookie": f"{COOKIE}={token.decode()}; Path=/; HttpOnly; SameSite=Strict"})
        if path != "/":
            return self._send(HTTPStatus.NOT_FOUND, "404: the status page is /\n")
        from redis.exceptions import RedisError

        from bridge.errors import BridgeError
        try:
            body = self.server.page()
        except (BridgeError, RedisError, OSError) as exc:   # Redis gone: this request's answer, not the server's end
            from bridge.redact import redact
            return self._send(HTTPStatus.SERVICE_UNAVAILABLE, f"503: {redact(str(exc))}\n")
        self._send(HTTPStatus.OK, body, "text/html; charset=utf-8")

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, "405: the status page is read-only\n", extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _refuse


class Fresh:
    """The page, rendered at most once every ``seconds`` however many viewers refresh it: listing
    the policies' sources is a billed request, sent at most that often."""

    def __init__(self, make: Callable[[], str], seconds: float):
        self.make, self.seconds = make, seconds
        self._lock = threading.Lock()
        self._page: tuple[float, str] | None = None

    def __call__(self) -> str:
        with self._lock:
            if self._page is None or time.monotonic() - self._page[0] >= self.seconds:
                self._page = (time.monotonic(), self.make())
            return self._page[1]


def serve(ws, settings, policies: Path | None, address: tuple[str, int], token: str) -> StatusServer:
    """A server bound to ``address`` (not yet serving: call ``serve_forever``)."""
    return StatusServer(address, token, Fresh(lambda: render(gather(ws, settings, policies)), REFRESH_S - 1))

