"""Do the two table recipes ever decide differently on real logged rewards?

Run: ``python -m bench.table_recipes`` (about 2 minutes on 2 cores, most of it building the
precise tables). For each horizon it builds the Jeffreys table with the standard recipe (what
an on-demand build gives) and with the precise recipe (what the shipped tables use), replays
every shipped reward log (``examples/data``, and ``../shared/data`` when present) over a grid
of 31 costs ``c = f * sd`` (``f`` log-spaced on [1e-3, 1], ``sd`` the log's reward standard
deviation) with each table, and counts the prompts whose number of samples or chosen sample
differs. The largest relative difference between the two tables on the compared rows is printed
beside the count: the baseline here is the precise table, measured in the same run.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LOGS = ("alpacaeval_tulu2_bon11", "tot_creative_writing_gpt4")


def _logs() -> dict[str, np.ndarray]:
    from beacon.evaluation import load_logged

    found: dict[str, np.ndarray] = {}
    for name in LOGS:
        for path in (
            ROOT / "examples" / "data" / f"{name}.jsonl",
            ROOT.parent / "shared" / "data" / f"{name}_dev.jsonl",
        ):
            if path.is_file():
                found[path.name] = load_logged(path).rewards
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--horizons", type=int, nargs="*", default=[8, 10])
    args = ap.parse_args()
    from beacon import BeaconConfig, replay
    from beacon.index import cache
    from beacon.index.build import PRECISE, STANDARD, build_table

    logs = _logs()
    total = differ = 0
    for n in args.horizons:
        t0 = time.perf_counter()
        std = build_table(n, recipe=STANDARD)
        t1 = time.perf_counter()
        prec = build_table(n, recipe=PRECISE)
        t2 = time.perf_counter()
        z = std.z[std.z <= 4.0]
        gap = max(
            float(np.max(np.abs(std.grid_values(k)[: z.size] / prec.h(k, z) - 1.0)))
            for k in range(std.k_min, n)
        )
        print(
            f"n={n}: standard build {t1 - t0:.2f} s, precise {t2 - t1:.1f} s; "
            f"largest relative gap on zhat <= 4: {gap:.1e}"
        )
        for name, rewards in logs.items():
            r = np.ascontiguousarray(rewards[:, :n])
            sd = float(np.nanstd(r))
            n_diff = n_all = 0
            for f in np.logspace(-3.0, 0.0, 31):
                cfg = BeaconConfig(cost=float(f * sd), horizon=n)
                out = []
                for table in (std, prec):
                    cache.clear_memory_cache()
                    cache._MEMO[(n, -0.5, 0.0)] = cache.TableFound(table, "bench", Path())
                    out.append(replay(r, cfg))
                a, b = out
                d = (a.n_samples != b.n_samples) | (a.chosen != b.chosen)
                n_diff += int(d.sum())
                n_all += int(d.size)
            cache.clear_memory_cache()
            print(f"  {name:42s} {n_diff:6d} of {n_all:6d} prompt decisions differ")
            total += n_all
            differ += n_diff
    print(f"all: {differ} of {total} prompt decisions differ ({differ / max(total, 1):.1e})")


if __name__ == "__main__":
    main()
