"""`mcbridge cp` along every ordered pair of {local, s3, gs, az}: the tree comes back byte-identical."""

from __future__ import annotations

import itertools

import pytest

from tests.helpers import make_tree, mcbridge, read_tree, settings_for

KINDS = ("local", "s3", "gs", "az")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, emulator_env, moto, fake_gcs, azurite):
    """The test tree on each of the four stores, put there by `mcbridge cp` from a local folder."""
    from tests.emulators import unique_name
    base = tmp_path_factory.mktemp("matrix")
    files = make_tree(base / "src")
    roots = {"local": f"{base / 'src'}/"}
    emulators = {"s3": moto, "gs": fake_gcs, "az": azurite}
    for kind in ("s3", "gs", "az"):
        bucket = unique_name()
        emulators[kind].create_bucket(bucket)
        roots[kind] = f"{kind}://{bucket}/tree/"
        r = mcbridge("cp", roots["local"], roots[kind], "--chunk-size", "5MiB", "-q",
                     env=emulator_env, state_dir=base / "state")
        assert r.returncode == 0, r.stderr
    return files, roots, base


PAIRS = list(itertools.permutations(KINDS, 2))


@pytest.mark.parametrize("src,dst", PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_cp_pair(src, dst, seeded, make_root, emulator_env, tmp_path):
    files, roots, _base = seeded
    target = make_root(dst) + "copy/"
    r = mcbridge("cp", roots[src], target, "--chunk-size", "5MiB", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "manifest" in r.stdout
    assert read_tree(target, settings_for(emulator_env)) == files
    v = mcbridge("verify", target, env=emulator_env, state_dir=tmp_path)
    assert v.returncode == 0, v.stdout + v.stderr


def test_single_object_copy_into_prefix_and_to_exact_key(seeded, make_root, emulator_env, tmp_path):
    files, roots, _ = seeded
    dst = make_root("gs")
    r = mcbridge("cp", roots["s3"] + "big/weights.bin", dst + "ckpt/", "-q", env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    r = mcbridge("cp", roots["az"] + "données/ünïcödé 名前.txt", dst + "ckpt/renamed.txt", "-q",
                 env=emulator_env, state_dir=tmp_path)
    assert r.returncode == 0, r.stderr
    got = read_tree(dst + "ckpt/", settings_for(emulator_env))
    assert got == {"weights.bin": files["big/weights.bin"], "renamed.txt": files["données/ünïcödé 名前.txt"]}
    v = mcbridge("verify", dst + "ckpt/", env=emulator_env, state_dir=tmp_path)
    assert v.returncode == 0, v.stdout  # the manifest merges both single-object copies
