"""`import beacon` must stay light: no frameworks, no adapters, no numba."""

import subprocess
import sys

FORBIDDEN = [
    "langchain",
    "langchain_core",
    "llama_index",
    "celery",
    "aiohttp",
    "beacon_integrations",
    "worker",
    "numba",
    "matplotlib",
]


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return {m.split(".")[0] for m in out}


def test_import_beacon_imports_no_framework() -> None:
    loaded = _loaded_after("import beacon")
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))


def test_building_a_config_and_stopper_imports_no_framework() -> None:
    loaded = _loaded_after(
        "import beacon\ncfg = beacon.BeaconConfig(family='bernoulli', horizon=8)\n"
        "s = beacon.Stopper(cfg)\ns.next_decision()\ns.observe(0)\ns.next_decision()"
    )
    assert not loaded & (set(FORBIDDEN) - {"numba"}), sorted(loaded & set(FORBIDDEN))
