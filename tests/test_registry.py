"""Backends are found through registries that say which extra to install when one is missing."""

from __future__ import annotations

import pytest

from bridge import registry
from bridge.errors import MissingBackend
from bridge.stores import REGISTRY, store_class
from bridge.stores.base import Store


def test_missing_extra_names_the_install_command():
    # the command for the install at hand: an editable clone's path, or the wheel it came from
    hint = registry.install_hint("s3")
    assert hint.startswith("pip install ") and "[s3]" in hint
    with pytest.raises(MissingBackend) as refused:
        registry.load("no_such_sdk_module:Store", "s3", "s3://")
    assert str(refused.value) == f"s3:// needs the 's3' extra: {hint} (no_such_sdk_module is missing)"


@pytest.mark.parametrize("scheme", sorted(REGISTRY))
def test_every_registered_store_loads_and_declares_its_features(scheme):
    cls = store_class(scheme)
    assert issubclass(cls, Store) and cls.scheme == scheme
    f = cls.features
    assert f.min_part_size <= f.max_part_size and f.max_parts > 0
