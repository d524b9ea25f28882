"""The route planner and the cost model as pure functions: a scenario table with known answers,
and three plans priced by hand from the same price tables."""

from __future__ import annotations

from importlib import resources

import pytest

from bridge.policies.cost import usage as counting
from bridge import routes as registry
from bridge.contracts import FilePlan
from bridge.pipeline.plan import Plan
from bridge.policies import routes
from bridge.policies.cost.model import Overrides, Place, price
from bridge.policies.cost.prices import GB, PriceError, builtin, parse

MiB, GiB, TiB = 1 << 20, 1 << 30, 1 << 40
ALL = set(routes.ORDER)
UNENABLED = ALL - set(registry.NATIVE)   # what bridge runs here before the native routes are enabled
SITE = Place("site", "local")


def plan_of(src: str, dst: str, files: list[tuple[int, int]], count: int = 1) -> Plan:
    """A plan of ``count`` copies of each (size, part size) file."""
    out = [FilePlan(f"f{i}-{j}", size, part) for i, (size, part) in enumerate(files) for j in range(count)]
    return Plan(src, dst, None, out)


def choose(plan: Plan, src: Place, dst: Place, host: Place = SITE, available=UNENABLED, built=ALL,
           **kw) -> list[routes.RouteChoice]:
    usages = {r: plan.usage(r) for r in routes.ORDER}
    return routes.plan_routes(usages, src, dst, host, builtin(), available=available, built=built, **kw)


def chosen(choices: list[routes.RouteChoice]) -> routes.RouteChoice:
    picked = [c for c in choices if c.chosen]
    assert len(picked) == 1, [c.route for c in picked]
    return picked[0]


S3E, S3W = Place("aws", "us-east-1"), Place("aws", "eu-west-1")
GCS, AZ = Place("gcp", "us-central1"), Place("azure", "eastus")
BIG = [(1 * GiB, 8 * MiB)]                      # ten 1 GiB files below: multipart
SMALL = [(10_000, 0)]                           # 100,000 files of 10 kB below

# (name, source URL, destination URL, src place, dst place, host, files, count, available, pack, expected)
SCENARIOS = [
    ("same account, same region", "s3://src-a/x/", "s3://dst-b/y/", S3E, S3E, SITE, BIG, 10, ALL, False, "server"),
    ("same account, server not available", "s3://src-a/x/", "s3://dst-b/y/", S3E, S3E, SITE, BIG, 10,
     frozenset({"direct", "pack"}), False, "direct"),
    ("same account, native routes not enabled", "s3://src-a/x/", "s3://dst-b/y/", S3E, S3E, SITE, BIG, 10, UNENABLED, False, "server"),
    ("same cloud, other region", "s3://src-a/x/", "s3://dst-b/y/", S3E, S3W, SITE, BIG, 10, ALL, False, "server"),
    # 100 GiB: DataSync's $0.55 per Enhanced mode execution is small beside what it saves per GB
    ("other region, server unavailable: datasync next", "s3://src-a/x/", "s3://dst-b/y/", S3E, S3W, SITE, BIG, 100,
     ALL - {"server"}, False, "datasync"),
    ("s3 -> gs", "s3://src-a/x/", "gs://dst-b/y/", S3E, GCS, SITE, BIG, 10, ALL, False, "sts"),
    ("s3 -> gs, sts unavailable: direct next", "s3://src-a/x/", "gs://dst-b/y/", S3E, GCS, SITE, BIG, 10,
     ALL - {"sts"}, False, "direct"),
    ("s3 -> az", "s3://src-a/x/", "az://dst-b/y/", S3E, AZ, SITE, BIG, 10, ALL, False, "from-url"),
    ("gs -> s3", "gs://src-a/x/", "s3://dst-b/y/", GCS, S3E, SITE, BIG, 10, ALL, False, "direct"),
    ("gs -> az", "gs://src-a/x/", "az://dst-b/y/", GCS, AZ, SITE, BIG, 10, ALL, False, "from-url"),
    ("az -> s3", "az://src-a/x/", "s3://dst-b/y/", AZ, S3E, SITE, BIG, 10, ALL, False, "direct"),
    ("az -> gs", "az://src-a/x/", "gs://dst-b/y/", AZ, GCS, SITE, BIG, 10, ALL, False, "sts"),
    ("small files local -> s3, packing allowed", "/data/x/", "s3://dst-b/y/", SITE, S3E, SITE, SMALL, 100_000,
     UNENABLED, True, "pack"),
    ("small files local -> s3, packing not asked for", "/data/x/", "s3://dst-b/y/", SITE, S3E, SITE, SMALL, 100_000,
     UNENABLED, False, "direct"),
    ("small files s3 -> az through a host in GCP, native routes not enabled", "s3://src-a/x/", "az://dst-b/y/", S3E, AZ,
     Place("gcp", "us-central1"), SMALL, 100_000, UNENABLED, True, "pack"),
    ("big files s3 -> az through a host in GCP: from-url skips the double egress", "s3://src-a/x/", "az://dst-b/y/", S3E,
     AZ, Place("gcp", "us-central1"), BIG, 10, ALL, True, "from-url"),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_scenarios(scenario):
    _name, su, du, src, dst, host, files, count, available, pack, expected = scenario
    choices = choose(plan_of(su, du, files, count), src, dst, host, available=available, pack_allowed=pack)
    pick = chosen(choices)
    assert pick.route == expected, [(c.route, c.valid, round(c.cost.total, 4), c.why) for c in choices]
    assert pick.valid
    # the choice is the cheapest valid one (to the cent), and nothing invalid was chosen
    cheapest = min(round(c.cost.total, 2) for c in choices if c.valid)
    assert round(pick.cost.total, 2) == cheapest
    for c in choices:
        assert c.valid == (c.route in available and routes.serves(
            c.route, c.usage.source.scheme, c.usage.destination.scheme, pack_allowed=pack) is None)
        assert c.why, c.route


def test_every_route_is_chosen_by_some_scenario():
    assert {s[-1] for s in SCENARIOS} == set(routes.ORDER)


def test_unavailable_routes_are_priced_but_invalid():
    choices = choose(plan_of("s3://src-a/x/", "gs://dst-b/y/", BIG, 10), S3E, GCS)
    by = {c.route: c for c in choices}
    assert not by["sts"].valid and by["sts"].why == "built, not enabled in these settings" and by["sts"].built
    assert by["sts"].cost.total > 0 and by["sts"].seconds > 0
    assert not by["server"].valid and "one store account" in by["server"].why
    assert by["direct"].chosen


def test_a_route_the_registry_lacks_is_priced_as_not_built():
    choices = choose(plan_of("s3://src-a/x/", "gs://dst-b/y/", BIG, 10), S3E, GCS, built=ALL - {"sts"})
    by = {c.route: c for c in choices}
    assert not by["sts"].valid and not by["sts"].built and by["sts"].why == "not built in this bridge"
    assert by["sts"].to_dict()["built"] is False and by["datasync"].to_dict()["built"] is True


def test_the_planner_lists_the_registry_routes_and_refuses_any_other_name():
    assert routes.ORDER == registry.NAMES
    with pytest.raises(routes.RouteError, match="unknown route 'rsync'"):
        routes.serves("rsync", "s3", "gs", pack_allowed=True)


def test_ties_in_dollars_go_to_the_faster_route():
    # s3 -> az: from-url and direct send the same requests and egress; from-url is assumed faster
    choices = choose(plan_of("s3://src-a/x/", "az://dst-b/y/", BIG, 10), S3E, AZ, available=ALL)
    by = {c.route: c for c in choices}
    assert round(by["from-url"].cost.total, 2) == round(by["direct"].cost.total, 2)
    assert by["from-url"].chosen and by["from-url"].seconds < by["direct"].seconds
    assert "faster" in by["from-url"].why


def test_forced_route_wins_and_an_invalid_one_is_refused():
    plan = plan_of("gs://src-a/x/", "s3://dst-b/y/", BIG, 10)
    pick = chosen(choose(plan, GCS, S3E, available=ALL, forced="datasync"))
    assert pick.route == "datasync" and pick.why.startswith("forced")
    with pytest.raises(routes.RouteError, match="route from-url cannot be used.*Azure"):
        choose(plan, GCS, S3E, available=ALL, forced="from-url")
    with pytest.raises(routes.RouteError, match="route sts cannot be used.*not enabled"):
        choose(plan_of("s3://src-a/x/", "gs://dst-b/y/", BIG, 1), S3E, GCS, forced="sts")
    with pytest.raises(routes.RouteError, match="unknown route"):
        choose(plan, GCS, S3E, forced="teleport")


# -- three plans priced by hand from policies/cost/prices/*.yaml ----------------------------------

def test_hand_priced_s3_to_local_60_tib_crosses_three_egress_tiers():
    plan = plan_of("s3://src-a/x/", "/restore/", [(1 * TiB, 128 * MiB)], 60)
    cost = price(plan.usage("direct"), S3E, SITE, SITE, builtin())
    # aws.yaml egress.internet.us: 10,240 GB at $0.09, next 40,960 at $0.085, the rest (10,240) at $0.07
    egress = 10_240 * 0.09 + 40_960 * 0.085 + 10_240 * 0.07          # = 5,120.00
    # source requests: 60 x 8,192 ranged GETs + 1 HEAD (bucket) at $0.0004/1,000; 1 LIST at $0.005/1,000
    requests = (60 * 8192 + 1) * 0.0004 / 1000 + 1 * 0.005 / 1000     # = 0.19661
    hand = egress + requests                                          # = 5,120.197
    assert cost.total == pytest.approx(hand, rel=0.02)
    assert cost.total == pytest.approx(5120.197, rel=0.0001)


def test_hand_priced_s3_cross_region_by_datasync():
    plan = plan_of("s3://src-a/x/", "s3://dst-b/y/", [(1 * GiB, 8 * MiB)], 100)
    cost = price(plan.usage("datasync"), S3E, S3W, SITE, builtin())
    transfer = 100 * 0.02            # inter-region from us-east-1 (aws.yaml egress.inter_region.us)
    fee = 100 * 0.015 + 0.55         # DataSync in Enhanced mode: per GB and one task execution
    #                                  (aws.yaml services.datasync_enhanced)
    # source: 1 HEAD bucket + 100 HEAD + 100 GET (read class, $0.0004/1,000) and 1 LIST ($0.005/1,000)
    # destination: 100 x (1 BEGIN + 128 PART + 1 COMPLETE) + 1 LIST of the service + 1 LIST of leftovers
    #   + 1 manifest PUT (write class, $0.005/1,000); 100 HEAD after complete + 100 HEAD verify
    #   + 1 HEAD bucket + 2 GET manifest (read class)
    src_req = 201 * 0.0004 / 1000 + 1 * 0.005 / 1000
    dst_req = (100 * 130 + 3) * 0.005 / 1000 + 203 * 0.0004 / 1000
    hand = transfer + fee + src_req + dst_req                         # = 4.115...
    assert cost.total == pytest.approx(hand, rel=0.02)
    assert cost.services == pytest.approx(2.05)
    basic = price(plan.usage("datasync"), S3E, S3W, SITE, builtin(),
                  Overrides(service_modes={"datasync": "BASIC"}))
    assert basic.services == pytest.approx(100 * 0.0125)          # services.datasync_basic: per GB only
    assert basic.total == pytest.approx(hand - fee + 100 * 0.0125, rel=0.02)
    assert "BASIC mode" in " ".join(basic.lines) and "ENHANCED mode" in " ".join(cost.lines)


def test_hand_priced_100k_small_files_local_to_s3():
    plan = plan_of("/data/x/", "s3://dst-b/y/", SMALL, 100_000)
    cost = price(plan.usage("direct"), SITE, S3E, SITE, builtin())
    # no egress (from a site, into a cloud); 100,000 PUT + manifest PUT + 1 LIST at $0.005/1,000,
    # 1 HEAD bucket + 2 GET manifest at $0.0004/1,000
    hand = 100_002 * 0.005 / 1000 + 3 * 0.0004 / 1000                 # = 0.50001
    assert cost.egress == 0
    assert cost.total == pytest.approx(hand, rel=0.02)


def test_discounts_interconnects_and_month_to_date_apply():
    plan = plan_of("s3://src-a/x/", "/restore/", [(1 * GiB, 0)], 100)
    usage = plan.usage("direct")
    base = price(usage, S3E, SITE, SITE, builtin()).egress
    assert base == pytest.approx(100 * 0.09)
    off = price(usage, S3E, SITE, SITE, builtin(), Overrides(discounts={"aws": {"egress_pct": 30}})).egress
    assert off == pytest.approx(100 * 0.09 * 0.7)
    link = price(usage, S3E, SITE, SITE, builtin(), Overrides(interconnects=[("aws:us-east-1", "site:local", 0.02)]))
    assert link.egress == pytest.approx(100 * 0.02)
    late = price(usage, S3E, SITE, SITE, builtin(), Overrides(month_to_date_gb={"aws": 10_200})).egress
    assert late == pytest.approx(40 * 0.09 + 60 * 0.085)


def test_retrieval_fee_of_a_cold_source():
    plan = plan_of("gs://src-a/x/", "gs://dst-b/y/", [(1 * GiB, 0)], 10)
    cost = price(plan.usage("server"), GCS, GCS, SITE, builtin(), source_class="COLDLINE")
    assert cost.retrieval == pytest.approx(10 * 0.02)
    with pytest.raises(ValueError, match="no retrieval price for storage class 'GLACIER' on gcp"):
        price(plan.usage("server"), GCS, GCS, SITE, builtin(), source_class="GLACIER")


def test_every_price_names_its_source_and_date():
    for table in builtin().values():
        assert table.egress.same_region.source and table.egress.same_region.date
        for tiers in table.egress.internet.values():
            assert "pricing page" in tiers.source and tiers.date.year >= 2024
        for cls in table.requests.classes.values():
            assert "pricing page" in cls.source
    assert builtin()["gcp"].services["storage_transfer"].usd_per_gb == 0
    assert builtin()["aws"].service("datasync", "ENHANCED").usd_per_gb > builtin()["aws"].service(
        "datasync", "BASIC").usd_per_gb > 0
    assert GB == 1 << 30


def test_a_bad_price_table_is_refused_naming_the_field():
    text = (resources.files("bridge.policies.cost") / "prices" / "aws.yaml").read_text()
    broken = text.replace("usd: 0.0004}", "usd: -1}", 1)
    with pytest.raises(PriceError, match=r"aws.yaml: requests.classes.read.usd: Input should be greater"):
        parse(broken, "aws.yaml")


# -- what actually ran, counted from the journal ---------------------------------------------

@pytest.mark.parametrize("dst", ["s3://dst-b/y/", "gs://dst-b/y/", "az://dst-b/y/"])
def test_units_that_ran_add_up_to_the_estimate(dst):
    """A job run in two goes (killed after two parts of the big file) is counted from the journal
    marks of each go; listing + both goes + commit equal the estimate, request by request."""
    plan = Plan("s3://src-a/x/", dst, None, [FilePlan("small.bin", 5000), FilePlan("big.bin", 20 * MiB, 8 * MiB)],
                ["gone.bin"])
    first = {"file:small.bin", "upload:big.bin", "part:big.bin:1", "part:big.bin:2"}
    second = first | {"part:big.bin:3", "file:big.bin"}
    ran_first = counting.ran(plan, set(), first, deletions=1)
    assert ran_first.payload == 5000 + 16 * MiB and ran_first.destination.requests["COMPLETE"] == 0
    total = counting.listing(plan)
    for part in (ran_first, counting.ran(plan, first, second), counting.commit(plan)):
        total = counting.add(total, part)
    expected = plan.usage("direct")
    assert total.source.requests == expected.source.requests
    assert total.destination.requests == expected.destination.requests
    assert (total.payload, total.destination.bytes_written) == (expected.payload, expected.destination.bytes_written)
    # through Redis and back: the same usage, the same dollars
    [back] = counting.from_fields(counting.to_fields(total), "s3://src-a/x/", dst)
    place = {"s3": S3E, "gs": GCS, "az": Place("azure", "eastus")}[dst[:2]]
    assert price(back, S3E, place, SITE, builtin()).total == pytest.approx(price(expected, S3E, place, SITE,
                                                                                 builtin()).total)
    # nothing new in the journal: nothing ran
    assert counting.ran(plan, second, second).request_count == 0


def test_files_a_route_carried_are_priced_as_that_route():
    """A server-side copy's finished files are its COPY requests with no egress; a file that fell
    back to direct (its parts in the journal) is counted as bridge sent it."""
    plan = Plan("s3://src-a/x/", "s3://src-a/y/", None,
                [FilePlan("a.bin", 4000), FilePlan("b.bin", 20 * MiB, 8 * MiB)], route="server")
    after = {"file:a.bin", "file:b.bin", "upload:b.bin", "part:b.bin:1", "part:b.bin:2", "part:b.bin:3"}
    routed = counting.ran_routed(plan, set(), after)
    assert [f.rel for f in counting.carried(plan, set(), after)] == ["a.bin"]
    assert routed.route == "server" and dict(routed.destination.requests) == {"COPY": 1}
    direct = counting.ran(plan, set(), after)
    assert direct.destination.requests["PART"] == 3 and direct.files == 1 and direct.payload == 20 * MiB
    fields = {**counting.to_fields(direct), **counting.to_fields(routed)}
    priced = {u.route: price(u, S3E, S3E, SITE, builtin()) for u in counting.from_fields(fields, plan.source,
                                                                                         plan.destination)}
    assert priced["server"].egress == 0 and priced["server"].requests == pytest.approx(0.005 / 1000)
    assert priced["direct"].egress > 0     # through this process at a site: out of AWS and back


def test_a_spread_file_is_begun_and_completed_by_the_job():
    plan = Plan("s3://src-a/x/", "s3://dst-b/y/", None, [FilePlan("big.bin", 64 * MiB, 8 * MiB)],
                completions=["big.bin"])
    done = counting.completions(plan)
    assert dict(done.destination.requests) == {"BEGIN": 1, "COMPLETE": 1, "HEAD": 1}
