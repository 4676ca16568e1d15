"""Fifth audit of the exact stopping core: the h-table cache's files and keys, and the Stopper and
the vectorised replay deciding alike over a wide space of configs and logs.

Each damaged cache file below made ``get_table`` (so a Stopper's first decision) raise an error
of Python's zip, tokenize or parser machinery instead of rebuilding the table; so did a cache
folder that cannot be searched, even for the shipped tables; a prior with ``nu0 = -0.0`` missed
the shipped table, and which table a process used for it and for ``nu0 = 0`` depended on which
was asked for first.
"""

from __future__ import annotations

import io
import math
import struct
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beacon import BeaconConfig, BetaPrior, ConfigError, Draw, NIGPrior, Stop, Stopper, replay
from beacon.errors import BeaconError
from beacon.index import cache as cache_mod
from beacon.index.build import PRECISE, STANDARD
from beacon.index.table import HTable

# a prior without a shipped table, quick to build (k_min = 1, horizon 5)
KEY = (5, 1.5, 2.0)


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty disk cache and an empty memo (restored afterwards for the other tests)."""
    monkeypatch.setenv("BEACON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache_mod, "_MEMO", {})
    return tmp_path


# -- damaged cache files -------------------------------------------------------------------------
def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {name: z.read(name) for name in z.namelist()}


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def _unclosed_npy_header(data: bytes) -> bytes:
    """A member's .npy header with an unclosed parenthesis (its zip checksum still valid):
    numpy's header tokenizer raised tokenize.TokenError."""
    members = _members(data)
    header = members["dx.npy"]
    assert b"'shape': ()" in header
    members["dx.npy"] = header.replace(b"'shape': ()", b"'shape': ((", 1)
    return _zip(members)


def _bad_npy_dtype(data: bytes) -> bytes:
    """A member's .npy header naming the dtype ``,f8``: numpy's dtype parser raised
    SyntaxError."""
    members = _members(data)
    header = members["dof.npy"]
    assert b"'descr': '<f8'" in header
    members["dof.npy"] = header.replace(b"'descr': '<f8'", b"'descr': ',f8'", 1)
    return _zip(members)


def _patch_central_directory(data: bytes, offset: int, value: int) -> bytes:
    """The first central-directory entry with the 16-bit field at ``offset`` set to ``value``."""
    at = data.index(b"PK\x01\x02") + offset
    return data[:at] + struct.pack("<H", value) + data[at + 2 :]


DAMAGES: dict[str, Callable[[bytes], bytes]] = {
    "npy header unparsable (TokenError)": _unclosed_npy_header,
    "npy dtype unparsable (SyntaxError)": _bad_npy_dtype,
    # compression method 99: zipfile's NotImplementedError
    "unknown compression method": lambda d: _patch_central_directory(d, 10, 99),
    # general-purpose flag bit 0: zipfile's RuntimeError asking for a password
    "member flagged as encrypted": lambda d: _patch_central_directory(d, 8, 1),
}


@pytest.mark.parametrize("damage", list(DAMAGES.values()), ids=list(DAMAGES))
def test_a_damaged_cache_file_is_a_config_error_and_is_rebuilt(
    cache_dir: Path, damage: Callable[[bytes], bytes]
) -> None:
    first = cache_mod.find_table(*KEY)
    assert first.source == "standard, built and cached"
    good = first.path.read_bytes()
    first.path.write_bytes(damage(good))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy may warn while it tries to parse the header
        with pytest.raises(ConfigError) as err:
            HTable.from_npz(first.path)
        assert err.value.field == "table" and err.value.value == str(first.path)

        cache_mod._MEMO.clear()  # a new process: the file is all it has
        again = cache_mod.find_table(*KEY)
    assert again.source == "standard, built and cached"
    np.testing.assert_array_equal(again.table.logh, first.table.logh)
    assert HTable.from_npz(first.path).recipe == STANDARD  # the damaged file was replaced


# -- a cache directory that cannot be searched -------------------------------------------------
def test_an_unsearchable_cache_dir_falls_back_to_shipped_or_built_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache folder whose name is too long (or, for another user, without search permission):
    Path.is_file raised, so even the default config's first decision failed with OSError."""
    monkeypatch.setenv("BEACON_CACHE_DIR", str(tmp_path / ("c" * 300)))  # ENAMETOOLONG
    monkeypatch.setattr(cache_mod, "_MEMO", {})
    s = Stopper(BeaconConfig(horizon=8))  # Jeffreys: the shipped table
    s.next_decision()
    s.observe([0.1, 0.5, 0.2])
    assert isinstance(s.next_decision(), Draw | Stop)
    assert cache_mod.find_table(8).source == "precise, shipped with the package"
    with pytest.warns(RuntimeWarning, match="could not write"):
        assert cache_mod.find_table(*KEY).source == "standard, built and cached"


def test_a_cache_dir_without_search_permission_is_no_table(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_is_file = Path.is_file

    def is_file(self: Path) -> bool:  # what stat answers in a folder without x permission
        if self.parent == cache_dir:
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    assert cache_mod.find_table(8).source == "precise, shipped with the package"
    assert cache_mod.find_table(*KEY).source == "standard, built and cached"


# -- a negative zero in the prior --------------------------------------------------------------
def test_a_prior_with_nu0_minus_zero_uses_the_shipped_table(cache_dir: Path) -> None:
    assert cache_mod.table_filename(8, -0.5, -0.0) == cache_mod.table_filename(8, -0.5, 0.0)
    assert cache_mod.shipped_path(8, -0.5, -0.0).is_file()

    minus = cache_mod.find_table(8, -0.5, -0.0)
    assert minus.source == "precise, shipped with the package"
    assert minus.table.recipe == PRECISE
    assert cache_mod.find_table(8, -0.5, 0.0).table is minus.table  # one memo entry
    assert not list(cache_dir.iterdir())  # nothing was built

    # the config path: NIGPrior keeps -0.0 (it equals 0.0), the table is the shipped one
    cfg = BeaconConfig(horizon=8, prior=NIGPrior(nu0=-0.0))
    assert math.copysign(1.0, cfg.resolved_prior.nu0) == -1.0
    s = Stopper(cfg)
    s.next_decision()
    s.observe([0.1, 0.5, 0.2])
    s.next_decision()
    assert not list(cache_dir.iterdir())


def test_alpha0_minus_zero_names_the_same_cache_file(cache_dir: Path) -> None:
    built = cache_mod.find_table(5, -0.0, 1.0)
    assert built.path.name == cache_mod.table_filename(5, 0.0, 1.0)
    cache_mod._MEMO.clear()
    assert cache_mod.find_table(5, 0.0, 1.0).source == "standard, from the disk cache"


# -- the Stopper and the replay decide alike -------------------------------------------------------
def _drive(cfg: BeaconConfig, row: np.ndarray) -> tuple[int, int, str, bool]:
    """A Stopper fed a logged row in order (NaN skipped): (samples, chosen column, reason,
    truncated), what beacon.replay reports for the row."""
    cols = np.flatnonzero(~np.isnan(row))
    s = Stopper(cfg)
    pos, trunc, reason = 0, False, "horizon"
    while isinstance(d := s.next_decision(), Draw):
        take = cols[pos : pos + d.count]
        s.observe(row[take].tolist())
        pos += take.size
        if take.size < d.count:
            trunc = True
            break
    else:
        reason = d.reason
    chosen = int(cols[s.best_index]) if s.best_index >= 0 else -1
    return s.k, chosen, reason, trunc


def _check_alike(x: np.ndarray, cfg: BeaconConfig) -> None:
    try:
        res = replay(x, cfg)
    except BeaconError:
        # a log the replay refuses holds a reward the Stopper refuses too
        with pytest.raises(BeaconError):
            for row in x:
                _drive(cfg, row)
        return
    for i, row in enumerate(x):
        got = (
            int(res.n_samples[i]),
            int(res.chosen[i]),
            str(res.stop_reason[i]),
            bool(res.truncated[i]),
        )
        assert got == _drive(cfg, row), (i, row.tolist(), cfg)


def _matrix(rows: list[list[float]]) -> np.ndarray:
    x = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for i, r in enumerate(rows):
        x[i, : len(r)] = r
    return x


# one prior per row of the paper's table of k0 (and Jeffreys), plus two at a row's float boundary
NIG_PRIORS = [
    NIGPrior(),  # Jeffreys, k0 = 3
    NIGPrior(0.2, 2.0, 1.5, 0.5),  # k0 = 0
    NIGPrior(0.0, 1.0, 0.3, 0.1),  # 2 alpha0 in (0, 1], nu0 > 0: k0 = 1
    NIGPrior(0.0, 2.0, 1.5, 0.0),  # beta0 = 0: k0 = 1
    NIGPrior(0.0, 0.0, 1.0, 0.2),  # nu0 = 0, beta0 > 0: k0 = 1
    NIGPrior(0.0, 0.0, 1.0, 0.0),  # nu0 = beta0 = 0: k0 = 2
    NIGPrior(0.0, 0.0, -0.25, 0.0),  # 2 alpha0 in (-1, 0]: k0 = 2
    NIGPrior(0.0, 0.0, 5e-17, 0.0),  # a dof within 1e-16 of a row boundary
    NIGPrior(0.0, 0.5, math.nextafter(-0.5, 1.0), 0.0),
]
SCALES = [1.0, 1e-300, 1e-8, 1e8, 2.5e138]
CELLS = st.one_of(st.floats(-3.0, 3.0), st.sampled_from([0.0, 0.5, 1.0, math.nan]))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.lists(st.lists(CELLS, min_size=1, max_size=40), min_size=1, max_size=4),
    prior=st.sampled_from(NIG_PRIORS),
    cost=st.one_of(st.floats(1e-6, 2.0), st.sampled_from([1e-300, 1e300])),
    batch=st.integers(1, 6),
    robust=st.booleans(),
    q=st.sampled_from([0.01, 0.3, 1e-9]),
    horizon=st.sampled_from([4, 5, 8, 13, 32, 64]),
    scale=st.sampled_from(SCALES),
    constant=st.booleans(),
)
def test_normal_replay_decides_as_the_stopper(
    rows: list[list[float]],
    prior: NIGPrior,
    cost: float,
    batch: int,
    robust: bool,
    q: float,
    horizon: int,
    scale: float,
    constant: bool,
) -> None:
    """Every k0 class, robust on and off at any quantile, batches, shipped and on-demand
    (odd) horizons, NaN gaps and short rows, rewards from 1e-300 to near the range's end, and
    constant rewards (the 1e-6 sigma floor)."""
    if not prior.is_jeffreys:
        # only Jeffreys' tables of 32 and 64 are shipped; building one takes 5 to 20 s
        horizon = min(horizon, 13)
    x = _matrix(rows)
    if constant:
        x = np.where(np.isnan(x), np.nan, 0.7)
    try:
        cfg = BeaconConfig(
            prior=prior, cost=cost, horizon=horizon, batch_size=batch, robust=robust,
            robust_quantile=q,
        )  # fmt: skip
    except ConfigError:
        return  # a horizon too short for the prior's k0
    _check_alike(x * scale, cfg)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.lists(
        st.lists(
            st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 0.5, 1.0, math.nan])),
            min_size=1,
            max_size=40,
        ),
        min_size=1,
        max_size=4,
    ),
    family=st.sampled_from(["bernoulli", "judge", "logit"]),
    a0=st.sampled_from([1.0, 0.5, 1e-3, 3.0, 1e-300]),
    b0=st.sampled_from([1.0, 0.5, 9.0, 1e-300, 1e300]),
    cost=st.one_of(st.floats(1e-9, 0.999), st.sampled_from([1e-300, 1e-12])),
    batch=st.integers(1, 6),
    horizon=st.sampled_from([4, 7, 8, 13]),
)
def test_beta_families_and_a_transform_replay_as_the_stopper(
    rows: list[list[float]],
    family: str,
    a0: float,
    b0: float,
    cost: float,
    batch: int,
    horizon: int,
) -> None:
    x = _matrix(rows)
    if family == "logit":  # the normal family on logit-transformed judge probabilities
        cfg = BeaconConfig(cost=cost, horizon=horizon, batch_size=batch, transform="logit")
    else:
        if family == "bernoulli":
            x = np.round(x)
        cfg = BeaconConfig(
            family=family, prior=BetaPrior(a0, b0), cost=cost, horizon=horizon, batch_size=batch
        )
    _check_alike(x, cfg)
