"""The :class:`HTable` object: one h-index table ``h_{n,k}(zhat)`` for a prior ``(alpha0, nu0)``.

Lookup (same numba code for scalars here and in the numba replay, see
:func:`beacon._kernels.tables.h_lookup`): cubic spline of ``log h`` in ``x = asinh(z / a)``
between the grid ends; outside them the exact asymptotes of the paper's Theorem h_properties
refined in docs/h_index.md:

* ``z > z_hi``:  ``h(z) = h(z_hi) (z / z_hi)^(1 - d)`` (``h ~ C z^(1-d)``, d = row dof); the
  policy stops for every cost above this vanishing value;
* ``z < z_lo``:  ``h(z) = -z + (h(z_lo) + z_lo) (z / z_lo)^(1 - d)`` (``h(z) + z -> 0+``; the
  continuation gain of a very poor incumbent is its distance to the mean).
"""

from __future__ import annotations

import math
import tokenize
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, overload

import numpy as np
import numpy.typing as npt

from beacon._checks import is_real, real_as_float
from beacon.errors import ConfigError

if TYPE_CHECKING:
    from beacon.index.build import Recipe

__all__ = ["HTable"]

FloatArray = npt.NDArray[np.float64]

_KERNELS: Any = None


def _kernels() -> Any:
    global _KERNELS
    if _KERNELS is None:
        from beacon._kernels import load_tables

        _KERNELS = load_tables()
    return _KERNELS


def _as_real_array(z: Any) -> FloatArray:
    """``z`` (a number or an array of them) as a float64 array, 0-d for a scalar.

    Anything else is a ConfigError naming ``z``: text, booleans, complex numbers, ``None``,
    object arrays and ragged nested sequences (numpy's own errors would not name the field).
    """
    try:
        za = np.asarray(z)
    except ValueError as exc:
        raise ConfigError("z", "ragged sequence", f"not an array of real numbers ({exc})") from None
    if za.dtype.kind in "iuf":
        return za.astype(np.float64)
    if za.ndim == 0:
        if is_real(z):  # a Python int beyond int64, a Fraction: numpy keeps them as objects
            return np.asarray(real_as_float(z))  # an int beyond the float range is +-inf
        raise ConfigError("z", z, "the standardized best reward must be a real number")
    raise ConfigError(
        "z",
        f"array of dtype {za.dtype}",
        "the standardized best rewards must be integers or real numbers",
    )


class HTable:
    """``h_{n,k}(zhat)`` for ``k_min <= k < n`` (Definition def_1 of the paper).

    Attributes:
        n: horizon; alpha0, nu0: the NIG prior parameters the table depends on;
        k_min: first row (``max(k0, 1)``, see :func:`beacon.index.build.k_min_for`);
        z: grid nodes ``z_i = scale * sinh(x_lo + i dx)``; logh: ``log h`` per row and node;
        m2: cubic-spline second derivatives of ``logh`` in ``x``; dof: ``2 alpha0 + k`` per row;
        recipe: the grid step and quadrature it was built with (``recipe.name`` is ``standard``
        for on-demand builds, ``precise`` for the shipped tables).
    """

    __slots__ = (
        "_arrays",
        "alpha0",
        "dof",
        "dx",
        "k_min",
        "logh",
        "m2",
        "n",
        "nu0",
        "recipe",
        "scale",
        "x_lo",
        "z",
    )

    def __init__(
        self,
        *,
        n: int,
        alpha0: float,
        nu0: float,
        k_min: int,
        x_lo: float,
        dx: float,
        scale: float,
        z: FloatArray,
        logh: FloatArray,
        m2: FloatArray,
        dof: FloatArray,
        recipe: Recipe,
    ) -> None:
        rows = n - k_min
        npts = z.shape[0]
        if logh.shape != (rows, npts) or m2.shape != (rows, npts) or dof.shape != (rows,):
            raise ConfigError(
                "table", f"logh{logh.shape}", f"expected {rows} rows of {npts} grid points"
            )
        if not np.all(np.isfinite(logh)):
            raise ConfigError("table", "logh", "contains non-finite values")
        self.n = int(n)
        self.alpha0 = float(alpha0)
        self.nu0 = float(nu0)
        self.k_min = int(k_min)
        self.x_lo = float(x_lo)
        self.dx = float(dx)
        self.scale = float(scale)
        self.z = np.ascontiguousarray(z, dtype=np.float64)
        self.logh = np.ascontiguousarray(logh, dtype=np.float64)
        self.m2 = np.ascontiguousarray(m2, dtype=np.float64)
        self.dof = np.ascontiguousarray(dof, dtype=np.float64)
        self.recipe = recipe
        for a in (self.z, self.logh, self.m2, self.dof):
            a.setflags(write=False)
        self._arrays = (
            self.x_lo,
            self.dx,
            self.scale,
            float(self.z[0]),
            float(self.z[-1]),
            self.logh,
            self.m2,
            self.dof,
            self.k_min,
        )

    # ------------------------------------------------------------------ lookups
    @property
    def z_range(self) -> tuple[float, float]:
        """``(z_lo, z_hi)``: the grid ends; outside them the asymptotes apply."""
        return float(self.z[0]), float(self.z[-1])

    def lookup_arrays(
        self,
    ) -> tuple[float, float, float, float, float, FloatArray, FloatArray, FloatArray, int]:
        """Arguments for ``beacon._kernels.tables.h_lookup(*arrays, k, z)`` (numba scalar)."""
        return self._arrays

    def _check_k(self, k: object) -> int:
        if isinstance(k, bool) or not isinstance(k, int | np.integer):
            raise ConfigError("k", k, "the number of rewards must be an integer")
        ki = int(k)
        if not self.k_min <= ki < self.n:
            raise ConfigError(
                "k", k, f"no h-index row; valid rows are {self.k_min} <= k < {self.n}"
            )
        return ki

    @overload
    def h(self, k: int, z: float) -> float: ...

    @overload
    def h(self, k: int, z: npt.NDArray[Any] | Sequence[Any]) -> FloatArray: ...

    def h(self, k: int, z: float | npt.NDArray[Any] | Sequence[Any]) -> float | FloatArray:
        """``h_{n,k}(z)``; ``z`` a float gives a float, an array gives an array of its shape
        (a 0-d array gives a float)."""
        ki = self._check_k(k)
        kern = _kernels()
        za = _as_real_array(z)
        if za.ndim == 0:
            zf = float(za)
            if math.isnan(zf):
                raise ConfigError("z", z, "the standardized best reward must not be NaN")
            return float(kern.h_lookup(*self._arrays, ki, zf))
        if np.isnan(za).any():
            raise ConfigError("z", "array with NaN", "the standardized best reward must not be NaN")
        flat = np.ascontiguousarray(za.reshape(-1))
        out: FloatArray = kern.h_lookup_array(*self._arrays, ki, flat)
        return out.reshape(za.shape)

    def grid_values(self, k: int) -> FloatArray:
        """``h_{n,k}`` at the grid nodes (``exp`` of the stored row)."""
        ki = self._check_k(k)
        out: FloatArray = np.exp(self.logh[ki - self.k_min])
        return out

    # ------------------------------------------------------------------ persistence
    def to_npz(self, path: str | Path | BinaryIO) -> None:
        """Write the table to ``path`` or an open binary file (``.npz``, no pickled objects)."""
        from beacon.index.build import FORMAT_VERSION

        np.savez(
            path,
            format_version=np.int64(FORMAT_VERSION),
            n=np.int64(self.n),
            alpha0=np.float64(self.alpha0),
            nu0=np.float64(self.nu0),
            k_min=np.int64(self.k_min),
            x_lo=np.float64(self.x_lo),
            dx=np.float64(self.dx),
            scale=np.float64(self.scale),
            z=self.z,
            logh=self.logh,
            m2=self.m2,
            dof=self.dof,
            recipe=self.recipe.as_array(),
        )

    @classmethod
    def from_npz(cls, path: str | Path) -> HTable:
        """Read a table written by :meth:`to_npz`; raises ``ValueError`` (a
        :class:`beacon.ConfigError`) on a bad file: not an ``.npz``, truncated, damaged, a member
        missing or of the wrong type (``OSError`` when the file cannot be opened)."""
        from beacon.index.build import FORMAT_VERSION, Recipe

        try:
            # opened here: numpy leaves its own handle open when the archive is damaged
            with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as f:
                version = int(f["format_version"])
                if version != FORMAT_VERSION:
                    raise ConfigError(
                        "format_version",
                        version,
                        f"table file {path} needs version {FORMAT_VERSION}",
                    )
                return cls(
                    n=int(f["n"]),
                    alpha0=float(f["alpha0"]),
                    nu0=float(f["nu0"]),
                    k_min=int(f["k_min"]),
                    x_lo=float(f["x_lo"]),
                    dx=float(f["dx"]),
                    scale=float(f["scale"]),
                    z=np.array(f["z"], dtype=np.float64),
                    logh=np.array(f["logh"], dtype=np.float64),
                    m2=np.array(f["m2"], dtype=np.float64),
                    dof=np.array(f["dof"], dtype=np.float64),
                    recipe=Recipe.from_array(f["recipe"]),
                )
        except ConfigError:
            raise
        except (
            zipfile.BadZipFile,  # truncated: numpy saw the zip magic but no archive
            # a damaged zip header: a member read as encrypted, or of an unknown compression
            # method or zip version (NotImplementedError, a RuntimeError)
            RuntimeError,
            # a damaged .npy header: numpy tokenizes it, then reads it as a Python literal
            tokenize.TokenError,
            SyntaxError,
            EOFError,
            zlib.error,
            KeyError,
            IndexError,
            TypeError,  # a bare .npy array (no context manager), a member of the wrong shape
            ValueError,
        ) as exc:
            raise ConfigError("table", str(path), f"not a readable table file ({exc!r})") from exc

    def __repr__(self) -> str:
        return (
            f"HTable(n={self.n}, alpha0={self.alpha0}, nu0={self.nu0}, k_min={self.k_min}, "
            f"grid={self.z.shape[0]} nodes on [{self.z[0]:.3g}, {self.z[-1]:.3g}], "
            f"recipe={self.recipe.name})"
        )
