"""Cost, in one place: what a job reads, writes and requests, what that costs, and the budgets
that limit it. The pure half is this package (functions over data; its only I/O is reading its
own price tables); the I/O half, which gathers the facts the pure half needs, is named below.

The pure half, here:

    usage.py      what a plan will read, write and request at each store, counted from its files
                  (every job kind's plan reports it through one method, ``plan.usage(route=...)``),
                  what ran between two looks at a job's journal, what a meter counted
    prices.py     the price tables, per provider, read from ``prices/*.yaml`` and checked
    model.py      a usage priced between two places: egress, requests, service fees, retrieval
    money.py      dollars as text and as JSON numbers, one rounding for both
    budgets.py    a monthly budget's rules: what a limit may be, which month a spend falls in

The route planner, which prices every route and picks one, is bridge.policies.routes.

The I/O half, elsewhere (each module's docstring says it is that half):

    bridge/pricing.py           where each store's bytes are (a bucket's region), a live plan
                                priced and its route chosen (``mcbridge plan``), ``--max-cost``
                                checked, a job's spend from its meter, a journal's marks read
    bridge/meter.py             the requests and bytes a job actually sent, counted at the client
    bridge/ops.py               ``job_usages``: the plans of a job planned to be priced (service)
    workers/redisbudgets.py     the service's budget store in Redis: limits, spend, reservations,
                                admission as one atomic script
"""
