"""Decisions as pure functions over data: what a plan costs, which route to take, what a
replication policy asks for. Nothing here talks to a store; bridge/ gathers the facts."""
