"""``mcbridge budgets set|list``: the monthly budgets jobs are charged to, in Redis."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from bridge.policies.cost import money
from bridge.cli.options import JsonOpt, out, usd_amount
from bridge.policies.cost.money import usd
from bridge.workers.commands.connection import BrokerOpt, connect, service_settings


def budgets_set(name: Annotated[str, typer.Argument(help="Budget name, e.g. a policy's.")],
                usd: Annotated[float, typer.Argument(min=0, help="Monthly limit in US dollars.")],
                broker: BrokerOpt = None) -> None:
    """Set the monthly limit of a budget; jobs submitted with --budget NAME are held above it."""
    from bridge.policies.cost.budgets import check
    from bridge.workers.redisbudgets import Budgets
    from bridge.workers.keys import Keys
    check(name, usd)
    usd_amount("USD", usd)
    ws = service_settings(broker)
    Budgets(connect(ws), Keys(ws.namespace)).set(name, usd)
    out.print(f"budget {name}: {money.usd(usd)} a month", markup=False)


def budgets_list(as_json: JsonOpt = False, broker: BrokerOpt = None) -> None:
    """Each budget's monthly limit and what was spent this month."""
    from bridge.policies.cost.budgets import month
    from bridge.workers.redisbudgets import Budgets
    from bridge.workers.keys import Keys
    ws = service_settings(broker)
    rows = Budgets(connect(ws), Keys(ws.namespace)).all()
    if as_json:
        shown = {name: {k: None if v is None else money.usd_number(v) for k, v in row.items()}
                 for name, row in rows.items()}
        out.print_json(json.dumps({"month": month(), "budgets": shown}))
        return
    for name, row in rows.items():
        cap = usd(row['limit_usd']) if row["limit_usd"] is not None else "no limit"
        out.print(f"{name}: {usd(row['spent_usd'])} spent in {month()} of {cap}", markup=False)


def register(app: typer.Typer) -> None:
    budgets = typer.Typer(no_args_is_help=True, help="Monthly budgets of the service: set, list.")
    budgets.command("set")(budgets_set)
    budgets.command("list")(budgets_list)
    app.add_typer(budgets, name="budgets")
