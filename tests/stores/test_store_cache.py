"""get_store: one store per equal settings, and a bounded number of them per process."""

from __future__ import annotations

import gc
import weakref

from bridge import stores
from bridge.config import load_settings
from tests.helpers import NO_CONFIG


def _settings(**s3):
    return load_settings({"s3": s3}, environ={"XDG_CONFIG_HOME": NO_CONFIG})


def test_equal_settings_share_a_store_and_secrets_tell_them_apart():
    a = stores.get_store("s3", _settings(endpoint_url="http://127.0.0.1:1", secret_access_key="one"))
    b = stores.get_store("s3", _settings(endpoint_url="http://127.0.0.1:1", secret_access_key="one"))
    c = stores.get_store("s3", _settings(endpoint_url="http://127.0.0.1:1", secret_access_key="two"))
    assert a is b, "a new Settings object with the same values must not build new SDK clients"
    assert c is not a, "settings differing only in a secret are another account"


def test_many_settings_do_not_pin_stores_forever():
    first = stores.get_store("s3", _settings(endpoint_url="http://127.0.0.1:1", region="r-first"))
    ref = weakref.ref(first)
    del first
    for i in range(3 * stores.CACHE_SIZE):
        stores.get_store("s3", _settings(endpoint_url="http://127.0.0.1:1", region=f"r{i}"))
        assert len(stores._cache) <= stores.CACHE_SIZE
    gc.collect()
    assert ref() is None, "an evicted store (and its SDK clients) must be freed"
    recent = _settings(endpoint_url="http://127.0.0.1:1", region=f"r{3 * stores.CACHE_SIZE - 1}")
    assert stores.get_store("s3", recent) is stores.get_store("s3", recent)
