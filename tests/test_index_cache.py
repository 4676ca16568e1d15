"""Where tables come from: shipped data, the disk cache (atomic, concurrent-safe), the memo."""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import numpy as np
import pytest

from beacon.index import cache as cache_mod
from beacon.index import get_table
from beacon.index.build import (
    FORMAT_VERSION,
    PRECISE,
    STANDARD,
    QuadratureSpec,
    Recipe,
    build_table,
)
from beacon.index.ship import SHIPPED_HORIZONS
from beacon.index.table import HTable

SHIPPED = list(SHIPPED_HORIZONS)


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BEACON_CACHE_DIR", str(tmp_path))
    cache_mod.clear_memory_cache()
    yield tmp_path
    cache_mod.clear_memory_cache()


def test_shipped_tables_load_without_building(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_build(*args: object, **kwargs: object) -> HTable:
        raise AssertionError("a shipped table was rebuilt")

    monkeypatch.setattr(cache_mod, "build_table", no_build)
    total = 0
    for n in SHIPPED:
        path = cache_mod.shipped_path(n, -0.5, 0.0)
        assert path.is_file(), path
        total += path.stat().st_size
        t = get_table(n)
        assert (t.n, t.alpha0, t.nu0, t.k_min) == (n, -0.5, 0.0, 3)
        assert t.recipe == PRECISE and t.recipe.name == "precise"
        assert get_table(n) is t  # memoised
        assert get_table(n, precise=True) is t  # already precise
    assert total < 4_000_000
    assert not list(cache_dir.iterdir())  # nothing written


def test_npz_format_has_no_pickles_and_names_the_prior() -> None:
    path = cache_mod.shipped_path(16, -0.5, 0.0)
    with np.load(path, allow_pickle=False) as f:
        assert int(f["format_version"]) == FORMAT_VERSION
        assert (int(f["n"]), float(f["alpha0"]), float(f["nu0"])) == (16, -0.5, 0.0)
        for key in ("z", "logh", "m2", "dof", "x_lo", "dx", "scale", "k_min", "recipe"):
            assert f[key].dtype != object
        assert Recipe.from_array(f["recipe"]) == PRECISE


def test_standard_build_agrees_with_the_shipped_precise_table() -> None:
    # (that a precise build reproduces the shipped file: tests/test_index_precise.py)
    shipped = HTable.from_npz(cache_mod.shipped_path(8, -0.5, 0.0))
    standard = build_table(8)
    assert standard.recipe == STANDARD and standard.z.shape[0] < shipped.z.shape[0]
    z = standard.z[standard.z <= 4.0]
    for k in range(3, 8):
        np.testing.assert_allclose(standard.h(k, z), shipped.h(k, z), rtol=1e-4)


def test_recipe_round_trips_and_custom_builds_are_labelled() -> None:
    for r in (STANDARD, PRECISE):
        assert Recipe.from_array(r.as_array()) is r
    t = build_table(5, quad=PRECISE.quad)
    assert t.recipe.name == "custom" and t.recipe.quad == PRECISE.quad
    with pytest.raises(ValueError, match="recipe"):
        Recipe.from_array([1.0, 2.0])


def test_precise_request_builds_once_and_is_preferred(cache_dir: Path) -> None:
    t = get_table(4, alpha0=0.5, nu0=1.0)
    assert t.recipe == STANDARD
    p = get_table(4, alpha0=0.5, nu0=1.0, precise=True)
    assert p.recipe == PRECISE and p is not t
    names = sorted(f.name for f in cache_dir.glob("*.npz"))
    assert names == sorted(
        [
            cache_mod.table_filename(4, 0.5, 1.0),
            cache_mod.table_filename(4, 0.5, 1.0, precise=True),
        ]
    )
    cache_mod.clear_memory_cache()
    # a new process finds the precise file first
    assert get_table(4, alpha0=0.5, nu0=1.0).recipe == PRECISE


def test_build_then_disk_cache_roundtrip(cache_dir: Path) -> None:
    t = get_table(7, alpha0=0.5, nu0=1.0)
    assert t.recipe == STANDARD
    files = list(cache_dir.glob("*.npz"))
    assert len(files) == 1 and "n7" in files[0].name and "precise" not in files[0].name
    cache_mod.clear_memory_cache()
    t2 = get_table(7, alpha0=0.5, nu0=1.0)
    assert t2 is not t
    assert np.array_equal(t.logh, t2.logh) and np.array_equal(t.m2, t2.m2)
    assert t2.h(2, 0.3) == t.h(2, 0.3)


def test_stale_or_corrupt_cache_file_is_rebuilt(cache_dir: Path) -> None:
    name = cache_mod.table_filename(5, 1.0, 1.0)
    (cache_dir / name).write_bytes(b"not an npz file")
    found = cache_mod.find_table(5, alpha0=1.0, nu0=1.0)
    t = found.table
    assert t.n == 5
    # the rejected file is not reported as the source: the table was built and written there
    assert (found.source, found.path) == ("standard, built and cached", cache_dir / name)
    assert cache_mod.find_table(5, alpha0=1.0, nu0=1.0) is found  # memo keeps the origin
    cache_mod.clear_memory_cache()
    again = cache_mod.find_table(5, alpha0=1.0, nu0=1.0)
    assert (again.source, again.path) == ("standard, from the disk cache", cache_dir / name)
    assert HTable.from_npz(cache_dir / name).n == 5
    # a wrong format version is rejected with a typed error naming the field
    bad = cache_dir / "bad.npz"
    data = dict(np.load(cache_dir / name, allow_pickle=False))
    data["format_version"] = np.int64(FORMAT_VERSION + 1)
    np.savez(bad, **data)
    with pytest.raises(ValueError, match="format_version"):
        HTable.from_npz(bad)


def test_cached_table_of_another_standard_recipe_is_rebuilt(cache_dir: Path) -> None:
    # a file at the standard name whose recipe is no longer STANDARD (e.g. written by a release
    # with another standard quadrature, same format version) is replaced, not served
    older = QuadratureSpec(order=12, panels=16, graded=3)
    assert older != STANDARD.quad
    name = cache_mod.table_filename(5, 1.0, 1.0)
    build_table(5, 1.0, 1.0, quad=older).to_npz(cache_dir / name)
    found = cache_mod.find_table(5, alpha0=1.0, nu0=1.0)
    assert found.table.recipe == STANDARD
    assert (found.source, found.path) == ("standard, built and cached", cache_dir / name)
    assert HTable.from_npz(cache_dir / name).recipe == STANDARD


def _build_in_child(cache: str, n: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    os.environ["BEACON_CACHE_DIR"] = cache
    from beacon.index import get_table as gt

    t = gt(n, alpha0=0.75, nu0=0.5)
    q.put(t.logh.tobytes())


def test_two_processes_build_the_same_table(cache_dir: Path) -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(str(cache_dir), 9, q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    files = [f.name for f in cache_dir.iterdir()]
    assert files == [cache_mod.table_filename(9, 0.75, 0.5)]  # no temp files left behind
    t = HTable.from_npz(cache_dir / files[0])
    assert t.logh.tobytes() == results[0]


def test_unwritable_cache_only_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("BEACON_CACHE_DIR", str(blocker / "sub"))
    cache_mod.clear_memory_cache()
    with pytest.warns(RuntimeWarning, match="could not write"):
        t = get_table(5, alpha0=2.0, nu0=1.0)
    assert t.n == 5
    cache_mod.clear_memory_cache()


def _damaged_files(good: bytes) -> dict[str, bytes]:
    """Cache files a crash, a full disk or another tool could leave behind."""
    import io

    def npz(**changes: object) -> bytes:
        data = dict(np.load(io.BytesIO(good), allow_pickle=False))
        data.update(changes)
        buf = io.BytesIO()
        np.savez(buf, **data)  # type: ignore[arg-type]
        return buf.getvalue()

    bare = io.BytesIO()
    np.save(bare, np.zeros(3))
    return {
        "truncated": good[: len(good) // 2],  # zip magic, no central directory
        "version-array": npz(format_version=np.array([1, 2])),
        "n-text": npz(n=np.array("eight")),
        "bare-npy": bare.getvalue(),
        "empty": b"",
    }


@pytest.mark.parametrize("kind", ["truncated", "version-array", "n-text", "bare-npy", "empty"])
def test_a_damaged_cache_file_is_rebuilt_and_from_npz_raises_value_error(
    cache_dir: Path, kind: str
) -> None:
    name = cache_mod.table_filename(5, 1.0, 1.0)
    good = cache_mod.find_table(5, alpha0=1.0, nu0=1.0).table
    path = cache_dir / name
    path.write_bytes(_damaged_files(path.read_bytes())[kind])
    with pytest.raises(ValueError):
        HTable.from_npz(path)
    cache_mod.clear_memory_cache()
    found = cache_mod.find_table(5, alpha0=1.0, nu0=1.0)
    assert found.source == "standard, built and cached"
    assert np.array_equal(found.table.logh, good.logh)
    assert HTable.from_npz(path).n == 5  # the damaged file was replaced
