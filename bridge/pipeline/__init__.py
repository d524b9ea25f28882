"""A transfer's stages, one module each, in the order a copy passes through them:

    bridge.listing              1 listing: the two roots, the source's objects, checked as they pass
    bridge.pipeline.plan        2 plan: files, part sizes, the units they run as
    bridge.routes, bridge.pricing
                                3 price and choose: which way the bytes go (``routes.decide``), what it costs
                                  (counted by ``plan.usage()``, priced by bridge.policies.cost)
    bridge.pipeline.units       4 units: one file, one part, a batch, a completion, a route's files
    bridge.pipeline.execute     5 executor: ``JobContext``, the units run on a pool (``execute``)
    bridge.pipeline.commit      6 commit: the journal made into the manifest's commit, last

beside them: bridge.pipeline.syncplan (a sync's plan) and bridge.pipeline.verify (a copy checked
against its record). bridge.ops strings them together for the CLI and the workers.
"""
