"""Bulk jobs without a server: spec, keys, crash-consistent writers, DPO, the local runner, CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import beacon
from beacon.jobs import (
    DpoWriter,
    FactoryCache,
    FactoryNotAllowedError,
    FactorySpec,
    JobInputError,
    JobProgress,
    JobSpec,
    KeyedJsonlWriter,
    LineError,
    OutputError,
    PromptExecutor,
    PromptRecord,
    arun_job,
    dpo_record,
    iter_prompt_file,
    job_fingerprint,
    normalize_allow_list,
    parse_allow_list,
    prompt_key,
    read_jsonl,
    run_job,
)
from beacon.jobs.spec import parse_prompt_line

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "prompts.jsonl"


def _spec(**cfg: Any) -> JobSpec:
    base: dict[str, Any] = {"family": "normal", "cost": 0.05, "horizon": 16}
    base.update(cfg)
    return JobSpec(FactorySpec("beacon.demo:generator", {"seed": 1}),
                   FactorySpec("beacon.demo:scorer", {"seed": 1}), beacon.BeaconConfig(**base))


def _write_prompts(path: Path, n: int, extra: list[str] | None = None) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt": f"question {i}: explain topic {i % 7}"}) + "\n")
        for line in extra or []:
            f.write(line + "\n")
    return path


def _keys_once(path: Path) -> Counter[str]:
    lines = path.read_bytes().decode().splitlines()
    return Counter(json.loads(x)["key"] for x in lines)


# -- spec ----------------------------------------------------------------------------------------
def test_prompt_line_errors_name_line_field_and_value() -> None:
    with pytest.raises(JobInputError) as e:
        parse_prompt_line('{"id": 3}', 7, source="p.jsonl")
    assert e.value.field == "prompt" and e.value.line == 7
    assert "p.jsonl line 7" in str(e.value)
    with pytest.raises(JobInputError) as e:
        parse_prompt_line('{"id": 1, "prompt": "x", "answer": 4}', 2)
    assert e.value.field == "answer" and e.value.value == 4
    with pytest.raises(JobInputError) as e:
        parse_prompt_line('{"id": true, "prompt": "x"}', 1)
    assert e.value.field == "id"
    with pytest.raises(JobInputError) as e:
        parse_prompt_line('{"id": 1, "prompt": "x", "metadata": {"v": NaN}}', 1)
    assert e.value.field == "line"
    with pytest.raises(JobInputError) as e:
        parse_prompt_line('{"id": 1, "prompt": "x", "generator": "not a path"}', 4)
    assert e.value.field == "generator.factory" and e.value.line == 4
    rec = parse_prompt_line('{"id": "a", "prompt": [{"role": "user", "content": "hi"}], '
                            '"reference": "42", "metadata": {"k": 1}}', 9)
    assert rec.line == 9 and rec.reference == "42" and rec.to_dict()["metadata"] == {"k": 1}


def test_iter_prompt_file_yields_line_errors_and_skips_blank(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": 1, "prompt": "a"}\n\n{oops\n{"id": 2, "prompt": "b"}\n')
    items = list(iter_prompt_file(p))
    assert [type(i).__name__ for i in items] == ["PromptRecord", "LineError", "PromptRecord"]
    bad = items[1]
    assert isinstance(bad, LineError) and bad.line == 3 and bad.raw == "{oops"


def test_prompt_file_with_a_byte_order_mark(tmp_path: Path) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b"}\n', encoding="utf-8-sig")
    items = list(iter_prompt_file(p))
    assert [i.id for i in items if isinstance(i, PromptRecord)] == [1, 2]


def test_progress_total_agrees_with_the_reader_on_unicode_blank_lines(tmp_path: Path) -> None:
    # Lines of Unicode whitespace only (a non-breaking space, an ideographic space), a bare
    # BOM line, a lone CR inside a line: the progress total counts exactly the lines the
    # reader yields, so the bar ends at its total (it used to end one short per such line).
    p = tmp_path / "p.jsonl"
    p.write_bytes(
        '{"id": 1, "prompt": "a"}\n\u00a0\n{"id": 2, "prompt": "b"}\n\u3000 \u00a0\n'
        '\u2028\n{"id": 3, "prompt": "c"}\r{"id": 4, "prompt": "d"}\n'.encode())
    items = list(iter_prompt_file(p))
    assert [i.id for i in items if isinstance(i, PromptRecord)] == [1, 2, 3, 4]
    assert len(items) == 4
    seen: list[JobProgress] = []
    s = run_job(p, _spec(), tmp_path / "out.jsonl", progress=seen.append, fsync=False)
    assert s.progress.total == 4 and s.progress.done == 4
    assert seen[-1].processed == seen[-1].total == 4


def test_allow_list_prefixes_are_module_boundaries() -> None:
    allowed = parse_allow_list("mycorp.models, other.")
    assert allowed == ("beacon.demo", "mycorp.models", "other")
    FactorySpec("mycorp.models.llm:make").check_allowed(allowed)
    FactorySpec("beacon.demo:generator").check_allowed(allowed)
    for path in ("mycorp.modelsx:make", "mycorp:make", "os:system", "beacon.demonic:x"):
        with pytest.raises(FactoryNotAllowedError) as e:
            FactorySpec(path).check_allowed(allowed)
        assert e.value.value == path and "allow-list" in e.value.reason
    with pytest.raises(beacon.ConfigError) as ce:
        parse_allow_list("good, bad module")
    assert ce.value.field == "BEACON_ALLOWED_FACTORIES"


def test_factory_refuses_reexported_names_and_private_attributes() -> None:
    # run_sync is imported into beacon.jobs.local from beacon._sync: not defined there.
    with pytest.raises(FactoryNotAllowedError) as e:
        FactorySpec("beacon.jobs.local:run_sync").build(["beacon.jobs.local"])
    assert "re-exported" in e.value.reason
    with pytest.raises(JobInputError):
        FactorySpec("beacon.demo:_Base")  # private names are not factories
    with pytest.raises(JobInputError) as e2:
        FactorySpec("beacon.demo:generator", {"nope": 1}).build(None)
    assert e2.value.field == "factory.kwargs"
    with pytest.raises(JobInputError) as e3:
        FactorySpec("beacon.demo:nothing").build(None)
    assert "no attribute" in e3.value.reason


def test_job_spec_round_trips_with_fitted_prior_and_transform() -> None:
    from beacon.fitting import fit_reward_model

    rng = __import__("numpy").random.default_rng(0)
    logged = rng.normal(rng.normal(size=(40, 1)), 0.5, size=(40, 12))
    fit = fit_reward_model(logged, family="normal", transform="gaussianize")
    cfg = fit.config(cost=0.02, horizon=16)
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"), cfg,
                   {"timeout": 5.0, "max_seconds": 30})
    back = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec
    assert back.config.prior == cfg.prior and back.config.transform == cfg.transform
    with pytest.raises(JobInputError) as e:
        JobSpec.from_dict({**spec.to_dict(), "sampling": {"tmeout": 1}})
    assert e.value.field == "sampling.tmeout"
    # "false" from a hand-written JSON file must not switch candidates on
    for bad in ("false", 1, None):
        with pytest.raises(JobInputError) as e:
            JobSpec.from_dict({**spec.to_dict(), "keep_candidates": bad})
        assert e.value.field == "keep_candidates"
    with pytest.raises(JobInputError):
        JobSpec(spec.generator, spec.scorer, cfg, keep_candidates="no")  # type: ignore[arg-type]
    np = __import__("numpy")
    kept = JobSpec(spec.generator, spec.scorer, cfg, keep_candidates=np.bool_(True))
    assert kept.to_dict()["keep_candidates"] is True


def test_job_spec_sampling_takes_numpy_scalars_and_stores_json_numbers() -> None:
    np = __import__("numpy")
    spec = _spec()
    sampling = {"timeout": np.float32(2.5), "max_attempts": np.int64(4), "max_seconds": 30}
    got = JobSpec(spec.generator, spec.scorer, spec.config, sampling)
    assert got.sampling == {"timeout": 2.5, "max_attempts": 4, "max_seconds": 30}
    assert [type(v) for v in got.sampling.values()] == [float, int, int]
    assert JobSpec.from_dict(json.loads(json.dumps(got.to_dict()))) == got
    for bad in ({"max_attempts": np.float64(2.0)}, {"timeout": np.bool_(True)},
                {"timeout": np.float64("nan")}):
        with pytest.raises(JobInputError) as e:
            JobSpec(spec.generator, spec.scorer, spec.config, bad)
        assert e.value.field == f"sampling.{next(iter(bad))}"


# -- keys ----------------------------------------------------------------------------------------
def test_prompt_key_covers_every_input_but_not_formatting() -> None:
    rec = PromptRecord("a", "hello", line=1)
    spec = _spec()
    k = prompt_key(rec, spec)
    assert k == prompt_key(PromptRecord("a", "hello", line=99), spec)
    assert k == prompt_key(rec, JobSpec(spec.generator, spec.scorer, spec.config,
                                        keep_candidates=True))
    variants = [
        prompt_key(PromptRecord("a", "hello!"), spec),
        prompt_key(PromptRecord("b", "hello"), spec),
        prompt_key(PromptRecord("a", "hello", reference="1"), spec),
        prompt_key(rec, JobSpec(FactorySpec("beacon.demo:generator", {"seed": 2}), spec.scorer,
                                spec.config)),
        prompt_key(rec, JobSpec(spec.generator, FactorySpec("beacon.demo:verifier"),
                                spec.config)),
        prompt_key(rec, JobSpec(spec.generator, spec.scorer, spec.config, {"timeout": 9.0})),
        prompt_key(rec, _spec(cost=0.06)),
        prompt_key(rec, _spec(prior=beacon.NIGPrior(0.0, 1.0, 2.0, 1.0))),
        prompt_key(PromptRecord("a", "hello", generator=FactorySpec("beacon.demo:generator")),
                   spec),
    ]
    assert len({k, *variants}) == len(variants) + 1
    assert len(k) == 32 and int(k, 16) >= 0


# -- writers -------------------------------------------------------------------------------------
def test_writer_recovers_torn_tail_and_never_duplicates(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    with KeyedJsonlWriter(p) as w:
        assert w.write({"key": "a", "v": 1}) and w.write({"key": "b", "v": float("nan")})
        assert not w.write({"key": "a", "v": 2})
    with p.open("ab") as f:
        f.write(b'{"key": "c", "v":')  # a torn append (killed mid-write)
    with KeyedJsonlWriter(p) as w:
        assert w.recovered_bytes == len(b'{"key": "c", "v":')
        assert w.keys == {"a", "b"}
        assert w.write({"key": "c", "v": 3})
    rows = list(read_jsonl(p))
    assert [r["key"] for r in rows] == ["a", "b", "c"] and rows[1]["v"] is None


def test_writer_keeps_a_whole_last_record_that_lacks_its_newline(tmp_path: Path) -> None:
    """A write torn just before its newline (or a hand-edited file) leaves a whole record:
    it is a result, kept -- not cut off as a torn tail and paid for again."""
    p = tmp_path / "out.jsonl"
    p.write_bytes(b'{"key": "a", "ok": true}\n{"key": "b", "ok": true}')
    with KeyedJsonlWriter(p) as w:
        assert w.keys == {"a", "b"} and w.recovered_bytes == 0
        assert not w.write({"key": "b", "ok": False}) and w.write({"key": "c", "ok": True})
    assert [r["key"] for r in read_jsonl(p)] == ["a", "b", "c"]
    assert p.read_bytes().count(b"\n") == 3
    # A garbage line before it is corruption, refused (nothing is cut silently).
    q = tmp_path / "q.jsonl"
    q.write_bytes(b'{"key": "a"}\ngarbage\n{"key": "b"}')
    with pytest.raises(OutputError, match="line 2"):
        KeyedJsonlWriter(q).open()
    # End to end: the rerun skips the prompt whose line lacked its newline.
    prompts = _write_prompts(tmp_path / "prompts.jsonl", 3)
    out = tmp_path / "run.jsonl"
    run_job(prompts, _spec(), out)
    out.write_bytes(out.read_bytes().rstrip(b"\n"))
    s = run_job(prompts, _spec(), out)
    assert (s.progress.skipped, s.progress.done, s.progress.samples) == (3, 0, 0)
    assert len(_keys_once(out)) == 3


_FULL_DISK = """
import os, resource, signal, sys
from beacon.jobs import KeyedJsonlWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: write() fails with EFBIG
path, limit = sys.argv[1], int(sys.argv[2])
w = KeyedJsonlWriter(path).open()
w.write({"key": "a", "text": "x" * 10})
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # the disk is (nearly) full
try:
    w.write({"key": "b", "text": "y" * 5000})
except OSError as exc:
    print("failed:", exc.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space was freed
w.write({"key": "c", "text": "z"})
w.close()
"""


def test_writer_cuts_off_the_partial_line_of_a_failed_write(tmp_path: Path) -> None:
    """A record written half-way (the disk filled up) is cut off at once, so the next record,
    written once space is free again, is not glued to it (a corrupt or lost line)."""
    import errno

    p = tmp_path / "out.jsonl"
    res = subprocess.run([sys.executable, "-c", _FULL_DISK, str(p), "1000"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"failed: {errno.EFBIG}"
    assert p.read_bytes().count(b"\n") == 2
    with KeyedJsonlWriter(p) as w:
        assert w.keys == {"a", "c"} and w.recovered_bytes == 0
    assert [r["key"] for r in read_jsonl(p)] == ["a", "c"]


def test_writer_refuses_corruption_in_the_middle_and_a_second_writer(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    p.write_text('{"key": "a"}\ngarbage\n{"key": "b"}\n')
    with pytest.raises(OutputError, match="line 2"):
        KeyedJsonlWriter(p).open()
    q = tmp_path / "q.jsonl"
    with KeyedJsonlWriter(q), pytest.raises(OutputError, match="another process"):
        KeyedJsonlWriter(q).open()


def test_writer_compaction_is_atomic_and_frees_keys(tmp_path: Path) -> None:
    p = tmp_path / "out.jsonl"
    with KeyedJsonlWriter(p) as w:
        for i in range(5):
            w.write({"key": f"k{i}", "ok": i % 2 == 0})
        dropped = w.compact(lambda r: r["ok"])
        assert sorted(r["key"] for r in dropped) == ["k1", "k3"]
        assert "k1" not in w and w.write({"key": "k1", "ok": True})
    assert [r["key"] for r in read_jsonl(p)] == ["k0", "k2", "k4", "k1"]
    assert not list(tmp_path.glob(".*.tmp"))
    # A compaction that fails half-way (here: its filter; in life a Ctrl-C, a full disk)
    # leaves the output as it was and no partial temporary copy behind.
    before = p.read_bytes()
    with KeyedJsonlWriter(p) as w, pytest.raises(ZeroDivisionError):
        w.compact(lambda r: 1 / (r["key"] != "k4") > 0)
    assert p.read_bytes() == before and not list(tmp_path.glob(".*.tmp"))


def test_copy_of_a_compaction_killed_half_way_is_removed_on_reopen(tmp_path: Path) -> None:
    # SIGKILL (or a power loss) during the atomic rewrite of a rerun leaves the temporary
    # copy behind -- up to a whole copy of the output; no later run removed it, so every crash
    # in that window left one more. The next writer of the file removes it.
    p = tmp_path / "out.jsonl"
    with KeyedJsonlWriter(p, fsync=False) as w:
        for i in range(50):
            w.write({"key": f"k{i}", "ok": i % 2 == 0})
    before = p.read_bytes()
    code = (
        "import os, signal, sys\n"
        "from beacon.jobs import KeyedJsonlWriter\n"
        "w = KeyedJsonlWriter(sys.argv[1]).open()\n"
        "seen = []\n"
        "def keep(r):\n"
        "    seen.append(r)\n"
        "    if len(seen) == 30:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return r['ok']\n"
        "w.compact(keep)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(p)], cwd=ROOT, timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert p.read_bytes() == before  # the output is the old file
    left = list(tmp_path.glob(".out.jsonl.*.tmp"))
    assert len(left) == 1  # the killed compaction's copy
    # Another file's copies are not ours to remove.
    others = [tmp_path / ".other.jsonl.1.tmp", tmp_path / ".out.jsonl.7.jsonl.1.tmp"]
    for other in others:
        other.write_text("x")
    with KeyedJsonlWriter(p) as w:
        assert len(w) == 50
    assert sorted(tmp_path.glob(".*.tmp")) == sorted(others)
    assert p.read_bytes() == before


def test_warm_start_resume_holds_only_the_rewards_of_finished_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Resuming with a warm start re-seeds the fit from the output: it held every finished
    # line whole (responses, usage, the kept candidates) in memory at once -- about 15 times
    # the output's size, an out-of-memory on a large job; only the rewards are needed.
    import beacon.jobs.local as local
    from beacon.jobs import WarmStart

    prompts = _write_prompts(tmp_path / "p.jsonl", 12)
    out = tmp_path / "out.jsonl"
    spec = JobSpec(_spec().generator, _spec().scorer, _spec().config, keep_candidates=True)
    run_job(prompts, spec, out, fsync=False)
    rewards = [r["rewards"] for r in read_jsonl(out)]
    seen: list[dict[str, Any]] = []
    real = local.seed_rewards

    def spy(records: list[dict[str, Any]]) -> list[list[float | None]]:
        seen.extend(records)
        return real(records)

    monkeypatch.setattr(local, "seed_rewards", spy)
    # one more prompt: the refit on the 12 resumed prompts is made before it starts
    more = _write_prompts(tmp_path / "p13.jsonl", 13)
    s = run_job(more, spec, out, fsync=False, warm_start=WarmStart(min_prompts=5))
    assert s.progress.skipped == 12 and s.warm_start is not None
    assert s.warm_start[0]["prompts"] == 12
    assert sorted(map(str, (r["rewards"] for r in seen))) == sorted(map(str, rewards))
    assert all(set(r) <= {"ok", "rewards"} for r in seen), seen[0].keys()


def test_dpo_record_skips_equal_rewards_and_reports_margin(tmp_path: Path) -> None:
    assert dpo_record("k", 1, "p", None) is None
    assert dpo_record("k", 1, "p", ({"text": "a", "reward": 1.0},
                                    {"text": "b", "reward": 1.0})) is None
    rec = dpo_record("k", 1, "p", ({"text": "a", "reward": 2.5}, {"text": "b", "reward": -0.5}))
    assert rec is not None and rec["margin"] == pytest.approx(3.0)
    assert (rec["chosen"], rec["rejected"]) == ("a", "b")
    with DpoWriter(tmp_path / "d.jsonl") as w:
        assert w.write_pair(rec) and not w.write_pair(rec) and not w.write_pair(None)


# -- demo ----------------------------------------------------------------------------------------
def test_demo_is_deterministic_by_seed() -> None:
    from beacon import demo

    async def draws(seed: int) -> list[tuple[str, float]]:
        g = demo.generator(seed=seed).bind({"id": 1})
        s = demo.scorer(seed=seed)
        out = []
        for _ in range(6):
            t = await g("p")
            out.append((t, await s("p", t)))
        return out

    a, b, c = (asyncio.run(draws(s)) for s in (0, 0, 1))
    assert a == b and a != c
    assert len({t for t, _ in a}) == 6  # distinct responses
    with pytest.raises(beacon.ConfigError) as e:
        demo.generator(fail_rate=2.0)
    assert e.value.field == "fail_rate"
    np = __import__("numpy")
    assert asyncio.run(draws(np.int64(1))) == c  # a numpy seed is the same seed
    for kwargs, field in (({"seed": 1.0}, "seed"), ({"seed": True}, "seed"),
                          ({"latency_ms": np.float64(-1.0)}, "latency_ms")):
        with pytest.raises(beacon.ConfigError) as e:
            demo.generator(**kwargs)
        assert e.value.field == field


# -- local runner --------------------------------------------------------------------------------
def test_local_run_writes_one_line_per_prompt_and_dpo(tmp_path: Path) -> None:
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    seen: list[JobProgress] = []
    s = run_job(EXAMPLES, _spec(), out, dpo=dpo, concurrency=4, progress=seen.append)
    n = sum(1 for x in EXAMPLES.read_text().splitlines() if x.strip())
    rows = list(read_jsonl(out))
    assert s.progress.done == n == len(rows) and s.exit_code == 0
    assert seen[-1].processed == n and seen[-1].total == n
    assert all(r["ok"] and r["stop_reason"] in beacon.STOP_REASONS for r in rows)
    assert all(3 <= r["n_samples"] <= 16 for r in rows)  # k0 = 3 under Jeffreys' prior
    pairs = list(read_jsonl(dpo))
    assert pairs and all(p["margin"] > 0 for p in pairs)
    assert {p["key"] for p in pairs} <= {r["key"] for r in rows}
    # A rerun finds everything done and runs nothing.
    s2 = run_job(EXAMPLES, _spec(), out, dpo=dpo)
    assert s2.progress.skipped == n and s2.progress.done == 0
    assert list(read_jsonl(out)) == rows


def test_local_run_with_bernoulli_verifier_keeps_candidates(tmp_path: Path) -> None:
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:verifier"),
                   beacon.BeaconConfig(family="bernoulli", cost=0.02, horizon=12),
                   keep_candidates=True)
    math_only = tmp_path / "m.jsonl"
    math_only.write_text("".join(x + "\n" for x in EXAMPLES.read_text().splitlines()
                                 if '"reference"' in x))
    run_job(math_only, spec, tmp_path / "o.jsonl")
    rows = list(read_jsonl(tmp_path / "o.jsonl"))
    assert rows and all(r["ok"] for r in rows)
    for r in rows:
        rewards = [c["reward"] for c in r["candidates"]]
        assert set(rewards) <= {0.0, 1.0} and r["reward"] == max(rewards)
        assert (r["stop_reason"] == "absorbed") == (r["reward"] == 1.0)


def test_bad_lines_and_disallowed_override_fail_alone(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 20, [
        "{this is not json",
        json.dumps({"id": "x", "prompt": ""}),
        json.dumps({"id": "evil", "prompt": "hi", "generator": "os:system"}),
    ])
    out = tmp_path / "out.jsonl"
    s = run_job(prompts, _spec(), out, allowed=("beacon.demo",))
    rows = {r["line"]: r for r in read_jsonl(out)}
    assert s.progress.done == 20 and s.progress.failed == 3 and s.exit_code == 1
    assert rows[21]["error"]["field"] == "line" and "not valid JSON" in rows[21]["error"]["message"]
    assert rows[22]["error"]["field"] == "prompt"
    assert rows[23]["error"]["type"] == "FactoryNotAllowedError"
    assert rows[23]["error"]["value"] == "os:system" and rows[23]["id"] == "evil"
    assert all(rows[i]["ok"] for i in range(1, 21))


def test_text_with_no_utf8_form_fails_its_line_not_the_job(tmp_path: Path) -> None:
    # a JSON "\ud800" escape (lone surrogate) and a line with an undecodable byte
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(
        b'{"id": "a", "prompt": "fine"}\n'
        b'{"id": "s", "prompt": "x \\ud800"}\n'
        b'\xff garbage\n'
        b'{"id": "b", "prompt": "also fine"}\n'
    )
    out = tmp_path / "out.jsonl"
    s = run_job(prompts, _spec(), out)
    assert s.progress.done == 2 and s.progress.failed == 2 and s.exit_code == 1
    raw = out.read_bytes()
    raw.decode("utf-8")  # the output stays valid UTF-8
    rows = {r["line"]: r for r in read_jsonl(out)}
    assert rows[1]["ok"] and rows[4]["ok"]
    assert rows[2]["error"]["field"] == "prompt" and "lone surrogate" in rows[2]["error"]["message"]
    assert rows[3]["error"]["field"] == "line" and rows[3]["error"]["value"] == "\udcff garbage"
    again = run_job(prompts, _spec(), out, retry_failed=False)  # keys are stable: none rerun
    assert again.progress.done == 0 and again.progress.skipped == 2
    assert again.progress.kept_failed == 2 and again.exit_code == 1
    records = [{"id": "x", "prompt": "a\ud800b"}, {"id": "y", "prompt": "ok"}]
    s2 = run_job(records, _spec(), tmp_path / "out2.jsonl")
    assert s2.progress.done == 1 and s2.progress.failed == 1


def test_str_allow_list_is_parsed_like_the_env_variable_never_per_character(
    tmp_path: Path,
) -> None:
    # A str was iterated character by character: "x*" contained the entry "*" (every module).
    spec = _spec()
    for text in ("mycorp.factories", "mycorp.factories, other.", "x", ""):
        assert normalize_allow_list(text) == parse_allow_list(text)
        assert FactoryCache(text).allowed == parse_allow_list(text)
        with pytest.raises(FactoryNotAllowedError):
            FactorySpec("os:getcwd").check_allowed(text)
    assert normalize_allow_list("mycorp.factories,*") == parse_allow_list("mycorp.factories,*")
    bads: list[Any] = ["x*", "mycorp.*", "ok, bad module", ["x*"], [None], ("",), 5, b"x*"]
    for bad in bads:
        for check in (normalize_allow_list, FactoryCache,
                      lambda a: PromptExecutor(spec, allowed=a),
                      lambda a: FactorySpec("os:getcwd").check_allowed(a),
                      lambda a: FactorySpec("os:getcwd").build(a)):
            with pytest.raises(JobInputError) as e:
                check(bad)
            assert e.value.field == "allowed"
    out = tmp_path / "out.jsonl"
    with pytest.raises(JobInputError) as e:
        run_job([{"id": 1, "prompt": "q"}], spec, out, allowed="x*")
    assert (e.value.field, e.value.value) == ("allowed", "x*") and not out.exists()
    # Like BEACON_ALLOWED_FACTORIES, the defaults are included and prefixes are whole names.
    recs = [{"id": 1, "prompt": "q"}, {"id": 2, "prompt": "q", "generator": "os:getcwd"}]
    s = run_job(recs, spec, out, allowed="mycorp.factories")
    rows = {r["id"]: r for r in read_jsonl(out)}
    assert s.progress.done == 1 and rows[1]["ok"]
    assert rows[2]["error"]["type"] == "FactoryNotAllowedError"


def _bad_run_args(tmp_path: Path) -> list[tuple[str, dict[str, Any]]]:
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "out.jsonl"
    ok: dict[str, Any] = {"prompts": prompts, "spec": _spec(), "out": out}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("call_concurrency", {"call_concurrency": 0}),
        ("call_concurrency", {"call_concurrency": 2.0}),
        ("concurrency", {"concurrency": 0}),
        ("concurrency", {"concurrency": True}),
        ("spec", {"spec": None}),
        ("spec", {"spec": _spec().to_dict()}),
        ("prompts", {"prompts": None}),
        ("prompts", {"prompts": 5}),
        ("prompts", {"prompts": b'{"id": 1, "prompt": "q"}'}),
        ("prompts", {"prompts": {"id": 1, "prompt": "q"}}),
        ("prompts", {"prompts": tmp_path / "missing.jsonl"}),
        ("prompts", {"prompts": tmp_path}),
        ("out", {"out": None}),
        ("out", {"out": ""}),
        ("out", {"out": tmp_path}),
        ("out", {"out": prompts}),
        ("dpo", {"dpo": out}),
        ("dpo", {"dpo": 5}),
        ("progress", {"progress": 5}),
        ("retry_failed", {"retry_failed": "no"}),
        ("fsync", {"fsync": None}),
        ("executor", {"executor": object()}),
        ("allowed", {"allowed": 5}),
    ]
    return [(field, {**ok, **kw}) for field, kw in cases]


def test_run_job_rejects_bad_arguments_up_front_naming_them(tmp_path: Path) -> None:
    for field, kw in _bad_run_args(tmp_path):
        seen: list[JobProgress] = []
        kw.setdefault("progress", seen.append)
        value = kw[field]
        with pytest.raises(beacon.ConfigError) as e:
            run_job(kw.pop("prompts"), kw.pop("spec"), kw.pop("out"), **kw)
        assert e.value.field == field, (field, e.value)
        assert e.value.value is value or e.value.value == value
        # Raised before anything ran: no output file, no progress report.
        assert not (tmp_path / "out.jsonl").exists() and not seen
    field, kw = _bad_run_args(tmp_path)[0]
    with pytest.raises(beacon.ConfigError) as e:
        asyncio.run(arun_job(kw.pop("prompts"), kw.pop("spec"), kw.pop("out"), **kw))
    assert e.value.field == field


def test_job_helpers_reject_bad_arguments_naming_them(tmp_path: Path) -> None:
    spec = _spec()
    rec = PromptRecord(1, "q")
    for call, field in (
        (lambda: PromptExecutor(spec, allowed=None, call_concurrency=0), "call_concurrency"),
        (lambda: PromptExecutor(None, allowed=None), "spec"),  # type: ignore[arg-type]
        (lambda: KeyedJsonlWriter(None), "path"),  # type: ignore[arg-type]
        (lambda: DpoWriter(None), "path"),  # type: ignore[arg-type]
        (lambda: DpoWriter(tmp_path / "d.jsonl", fsync="yes"), "fsync"),  # type: ignore[arg-type]
        (lambda: prompt_key(rec, None), "spec"),  # type: ignore[arg-type]
        (lambda: prompt_key({"id": 1, "prompt": "q"}, spec), "record"),  # type: ignore[arg-type]
        (lambda: job_fingerprint(None, "abc"), "spec"),  # type: ignore[arg-type]
        (lambda: job_fingerprint(spec, None), "input_digest"),  # type: ignore[arg-type]
    ):
        with pytest.raises(beacon.ConfigError) as e:
            call()
        assert e.value.field == field
    assert not list(tmp_path.iterdir())


def test_numpy_integers_count_as_integers_and_are_stored_as_plain_ints(tmp_path: Path) -> None:
    np = __import__("numpy")
    rec = PromptRecord(np.int64(7), "q")
    assert type(rec.id) is int and rec == PromptRecord(7, "q")
    assert prompt_key(rec, _spec()) == prompt_key(PromptRecord(7, "q"), _spec())
    ex = PromptExecutor(_spec(), allowed=None, call_concurrency=np.int32(3))
    assert type(ex.call_concurrency) is int and ex.call_concurrency == 3
    out = tmp_path / "out.jsonl"
    s = run_job([{"id": np.int64(7), "prompt": "q"}, PromptRecord(np.int16(8), "r")], _spec(),
                out, concurrency=np.int64(2), call_concurrency=np.uint8(4))
    rows = list(read_jsonl(out))
    assert s.exit_code == 0 and sorted(r["id"] for r in rows) == [7, 8]
    assert {r["key"] for r in rows} == {prompt_key(PromptRecord(i, p), _spec())
                                       for i, p in ((7, "q"), (8, "r"))}


def test_interrupted_run_resumes_to_the_same_output(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 60)
    spec = _spec()
    ref = tmp_path / "ref.jsonl"
    run_job(prompts, spec, ref)

    out = tmp_path / "out.jsonl"

    async def interrupted() -> None:
        main = asyncio.current_task()
        assert main is not None

        def stop_after_some(p: JobProgress) -> None:
            if p.done == 25:
                main.cancel()

        await arun_job(prompts, spec, out, concurrency=8, progress=stop_after_some)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(interrupted())
    partial = _keys_once(out)
    assert 25 <= len(partial) < 60 and max(partial.values()) == 1
    s = run_job(prompts, spec, out)
    assert s.progress.skipped == len(partial) and s.progress.done == 60 - len(partial)

    def strip(r: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in r.items() if k != "usage"}

    got = {r["key"]: strip(r) for r in read_jsonl(out)}
    want = {r["key"]: strip(r) for r in read_jsonl(ref)}
    assert got == want and max(_keys_once(out).values()) == 1


_FLAKY_FLAG = "BEACON_TEST_FLAKY_SCORER_DOWN"


class _FlakyScorer:
    async def __call__(self, prompt: Any, response: str) -> float:
        if os.environ.get(_FLAKY_FLAG) == "1":
            raise ValueError("scorer is down")
        return float(len(response) % 7)


def flaky_scorer() -> _FlakyScorer:
    """Factory used by the retry test (this module is importable as ``test_jobs``)."""
    return _FlakyScorer()


def test_failed_prompts_are_retried_on_rerun_without_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 8)
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec(f"{__name__}:flaky_scorer"),
                   beacon.BeaconConfig(family="normal", horizon=8, max_failures=1))
    out = tmp_path / "out.jsonl"
    monkeypatch.setenv(_FLAKY_FLAG, "1")
    s1 = run_job(prompts, spec, out)
    assert s1.progress.failed == 8
    assert all(not r["ok"] and "scorer is down" in r["error"]["message"]
               for r in read_jsonl(out))
    monkeypatch.setenv(_FLAKY_FLAG, "0")
    kept = run_job(prompts, spec, out, retry_failed=False)
    assert kept.progress.kept_failed == 8 and kept.progress.skipped == 0
    assert kept.progress.done == 0 and kept.exit_code == 1
    s2 = run_job(prompts, spec, out)
    assert s2.progress.retried_failed == 8 and s2.progress.done == 8
    rows = list(read_jsonl(out))
    assert len(rows) == 8 and all(r["ok"] for r in rows)


def _pair_keys(out: Path) -> set[str]:
    """Keys of the ok lines whose rewards give a DPO pair (two scored rewards that differ)."""
    keys = set()
    for r in read_jsonl(out):
        vals = [x for x in r.get("rewards") or [] if x is not None]
        if r["ok"] and len(vals) >= 2 and max(vals) > min(vals):
            keys.add(r["key"])
    return keys


def test_dpo_pairs_for_prompts_finished_by_an_earlier_run_without_dpo(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 12)
    ref_out, ref_dpo = tmp_path / "ref.jsonl", tmp_path / "ref_dpo.jsonl"
    run_job(prompts, _spec(), ref_out, dpo=ref_dpo)
    want = {p["key"]: p for p in read_jsonl(ref_dpo)}
    assert want and set(want) == _pair_keys(ref_out)
    # 1. The earlier run kept its candidates: the pairs are rebuilt without a model call.
    kept = JobSpec(_spec().generator, _spec().scorer, _spec().config, keep_candidates=True)
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    run_job(prompts, kept, out)
    s = run_job(prompts, _spec(), out, dpo=dpo)
    assert {p["key"]: p for p in read_jsonl(dpo)} == want
    assert (s.progress.dpo_rebuilt, s.progress.skipped, s.progress.samples) == (len(want), 12, 0)
    # 2. No candidates: the rejected response was never saved, so those prompts run again and
    # their pair and output line come from the same draw.
    out2, dpo2 = tmp_path / "out2.jsonl", tmp_path / "dpo2.jsonl"
    run_job(prompts, _spec(), out2)
    s2 = run_job(prompts, _spec(), out2, dpo=dpo2)
    assert s2.progress.dpo_rerun == len(want) == s2.progress.done
    assert s2.progress.skipped == 12 - len(want) and s2.exit_code == 0
    rows = {r["key"]: r for r in read_jsonl(out2)}
    pairs = list(read_jsonl(dpo2))
    assert len(rows) == 12 and max(_keys_once(out2).values()) == 1
    assert {p["key"] for p in pairs} == _pair_keys(out2) == set(want)
    assert all(p["chosen"] == rows[p["key"]]["best"] for p in pairs)
    # 3. Idempotent: a rerun writes nothing and runs nothing.
    before = (out2.read_bytes(), dpo2.read_bytes())
    s3 = run_job(prompts, _spec(), out2, dpo=dpo2)
    assert (s3.progress.skipped, s3.progress.done, s3.progress.dpo_rerun) == (12, 0, 0)
    assert (out2.read_bytes(), dpo2.read_bytes()) == before


def test_no_dpo_rerun_refuses_paid_reruns_and_counts_the_missing_pairs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beacon.cli import app

    prompts = _write_prompts(tmp_path / "p.jsonl", 12)
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    run_job(prompts, _spec(), out)  # no --dpo, no candidates: the pairs cannot be rebuilt
    missing = _pair_keys(out)
    assert missing
    before = out.read_bytes()
    s = run_job(prompts, _spec(), out, dpo=dpo, dpo_rerun=False)
    p = s.progress
    assert (p.dpo_missing, p.dpo_rerun, p.done, p.samples, p.skipped) == (len(missing), 0, 0, 0,
                                                                         12)
    assert s.to_dict()["dpo_missing"] == len(missing) and s.exit_code == 0
    assert out.read_bytes() == before and list(read_jsonl(dpo)) == []
    with pytest.raises(beacon.ConfigError, match="dpo_rerun"):
        run_job(prompts, _spec(), out, dpo=dpo, dpo_rerun="no")
    args = ["run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
            "--generator-kwargs", '{"seed": 1}', "--scorer-kwargs", '{"seed": 1}', "--cost",
            "0.05", "--horizon", "16", "--out", str(out)]
    res = CliRunner().invoke(app, [*args, "--no-dpo-rerun"])
    assert res.exit_code == 2 and "--no-dpo-rerun needs --dpo" in res.output, res.output
    res = CliRunner().invoke(app, [*args, "--dpo", str(dpo), "--no-dpo-rerun", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert (summary["dpo_missing"], summary["dpo_rerun"], summary["done"]) == (len(missing), 0, 0)
    res = CliRunner().invoke(app, [*args, "--dpo", str(dpo), "--no-dpo-rerun"])
    assert res.exit_code == 0, res.output
    assert f"{len(missing)} left without their DPO pair" in res.stdout, res.output
    assert "without --no-dpo-rerun" in res.stderr, res.output
    assert out.read_bytes() == before and list(read_jsonl(dpo)) == []
    # Without the flag the reruns happen: every pair is written, output and pairs agree.
    s = run_job(prompts, _spec(), out, dpo=dpo)
    assert (s.progress.dpo_rerun, s.progress.dpo_missing, s.progress.done) == (
        len(missing), 0, len(missing))
    assert {q["key"] for q in read_jsonl(dpo)} == _pair_keys(out)
    assert max(_keys_once(out).values()) == 1 and len(_keys_once(out)) == 12


def test_dpo_pair_left_without_its_output_line_is_replaced_by_the_rerun(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 8)
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    run_job(prompts, _spec(), out, dpo=dpo)
    pairs = list(read_jsonl(dpo))
    # An interruption between the DPO write and the output write: a pair (from a draw whose
    # result was never saved) and no output line.
    orphan = pairs[0]["key"]
    out.write_text("".join(json.dumps(r) + "\n" for r in read_jsonl(out) if r["key"] != orphan))
    dpo.write_text("".join(json.dumps({**p, "chosen": "stale"} if p["key"] == orphan else p)
                           + "\n" for p in pairs))
    s = run_job(prompts, _spec(), out, dpo=dpo)
    assert s.progress.done == 1 and s.progress.skipped == 7
    got = {p["key"]: p for p in read_jsonl(dpo)}
    assert max(_keys_once(dpo).values()) == 1 and set(got) == {p["key"] for p in pairs}
    line = next(r for r in read_jsonl(out) if r["key"] == orphan)
    assert got[orphan]["chosen"] == line["best"] != "stale"


def test_kept_failed_lines_are_counted_and_fail_the_exit_code(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beacon.cli import app

    prompts = _write_prompts(tmp_path / "p.jsonl", 3, ["{not json", json.dumps({"id": 9})])
    out = tmp_path / "out.jsonl"
    first = run_job(prompts, _spec(), out)
    assert first.progress.failed == 2 and first.exit_code == 1
    kept = run_job(prompts, _spec(), out, retry_failed=False)
    assert (kept.progress.skipped, kept.progress.kept_failed, kept.progress.failed) == (3, 2, 0)
    assert kept.exit_code == 1 and kept.to_dict()["kept_failed"] == 2
    args = ["run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
            "--generator-kwargs", '{"seed": 1}', "--scorer-kwargs", '{"seed": 1}', "--cost",
            "0.05", "--horizon", "16", "--out", str(out), "--no-retry-failed"]
    res = CliRunner().invoke(app, [*args, "--json"])
    assert res.exit_code == 1, res.output
    summary = json.loads(res.stdout)
    assert (summary["kept_failed"], summary["skipped"], summary["failed"]) == (2, 3, 0)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and "2 failed earlier and kept" in res.stdout, res.output


def test_repeated_lines_count_as_duplicates_and_bad_line_lists_every_line(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    lines = [{"id": 0, "prompt": "a"}, {"id": 1, "prompt": "b"}, "{broken",
             {"id": 0, "prompt": "a"}, "{broken", {"id": 2, "prompt": "c"}, "{broken"]
    prompts.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n"
                               for x in lines))
    out = tmp_path / "out.jsonl"
    # One prompt at a time: "a" has finished when its repeat on line 4 is read.
    s = run_job(prompts, _spec(), out, concurrency=1)
    p = s.progress
    assert (p.done, p.failed, p.duplicates, p.skipped) == (3, 1, 3, 0)
    assert p.processed == p.total == 7
    bad = [r for r in read_jsonl(out) if not r["ok"]]
    assert len(bad) == 1 and bad[0]["line"] == 3 and bad[0]["lines"] == [3, 5, 7]
    assert "on lines 3, 5, 7" in bad[0]["error"]["message"]
    assert max(_keys_once(out).values()) == 1
    # A rerun retries the bad line (same key, same record) and counts the repeats the same way.
    again = run_job(prompts, _spec(), out, concurrency=1)
    q = again.progress
    assert (q.skipped, q.failed, q.duplicates, q.retried_failed) == (3, 1, 3, 1)
    assert [r["lines"] for r in read_jsonl(out) if not r["ok"]] == [[3, 5, 7]]
    # Keys of good prompts are those of earlier versions (their outputs stay resumable).
    assert prompt_key(PromptRecord(0, "a"), _spec()) == "bdd7100cfcacc917965875a45cab6e15"


def test_bad_records_sharing_a_long_prefix_are_not_taken_for_repeats(tmp_path: Path) -> None:
    """Templated prompts share long preambles: two different bad records are two errors."""
    preamble = "You are a careful assistant. " * 100  # > 2000 characters
    recs = [{"prompt": preamble + f"question {i}", "id": i, "bogus": 1} for i in range(2)]
    out = tmp_path / "out.jsonl"
    s = run_job(recs, _spec(), out)
    assert (s.progress.failed, s.progress.duplicates) == (2, 0)
    rows = list(read_jsonl(out))
    assert sorted(r["lines"] for r in rows) == [[1], [2]]
    assert all(r["error"]["field"] == "bogus" for r in rows)


def test_rerun_retries_only_this_jobs_failed_lines(tmp_path: Path) -> None:
    job_a = _write_prompts(tmp_path / "a.jsonl", 3, ["{not json"])
    out = tmp_path / "out.jsonl"
    run_job(job_a, _spec(), out)
    a_failed = [r for r in read_jsonl(out) if not r["ok"]]
    assert len(a_failed) == 1
    # Job B into the same output (given as a one-shot generator): A's failed line stays.
    recs = [{"id": f"b{i}", "prompt": f"other {i}"} for i in range(3)] + [{"id": "b-bad"}]
    s = run_job((r for r in recs), _spec(), out)
    assert s.progress.retried_failed == 0 and s.progress.failed == 1 and s.progress.done == 3
    rows = list(read_jsonl(out))
    assert a_failed[0] in rows and len(rows) == 8
    # B again (one-shot input): only B's failed line is retried; A's is still there.
    s = run_job((r for r in recs), _spec(), out)
    assert (s.progress.retried_failed, s.progress.failed, s.progress.skipped) == (1, 1, 3)
    assert s.progress.total == 4 and a_failed[0] in list(read_jsonl(out))
    # A again: its own failed line is retried.
    s = run_job(job_a, _spec(), out)
    assert (s.progress.retried_failed, s.progress.skipped) == (1, 3)
    assert len(list(read_jsonl(out))) == 8 and max(_keys_once(out).values()) == 1


def test_progress_callback_error_loses_no_result(tmp_path: Path) -> None:
    prompts = _write_prompts(tmp_path / "p.jsonl", 12)
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    boom = RuntimeError("bug in the progress bar")
    calls: list[JobProgress] = []

    def progress(p: JobProgress) -> None:
        calls.append(p)
        if p.in_flight == 4 and p.done == 0:
            raise boom

    with pytest.raises(RuntimeError) as e:
        run_job(prompts, _spec(), out, dpo=dpo, concurrency=4, progress=progress)
    # The four prompts in flight finished and were written; nothing else started.
    rows = list(read_jsonl(out)) if out.exists() else []
    assert len(rows) == 4 and all(r["ok"] for r in rows)
    assert e.value is boom and "rerun to resume" in "".join(getattr(e.value, "__notes__", []))
    assert len(calls) == 4  # never called again once it raised
    assert {p["key"] for p in read_jsonl(dpo)} == _pair_keys(out)
    s = run_job(prompts, _spec(), out, dpo=dpo)
    assert s.progress.skipped == 4 and s.progress.done == 8 and s.exit_code == 0


@pytest.mark.parametrize("where", ["loop", "task"])
@pytest.mark.parametrize("how", ["KeyboardInterrupt", "CancelledError", "cancel"])
def test_progress_callback_is_never_called_after_an_interruption(tmp_path: Path, how: str,
                                                                 where: str) -> None:
    """Ctrl-C or a cancellation raised in the callback interrupts the run, and the callback is
    not called again; a cancellation from outside (here the callback cancelling the run's task
    without raising) ends with one last call whose counts match what was written."""
    prompts = _write_prompts(tmp_path / "p.jsonl", 12)
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    interrupted: list[str] = []
    before: list[JobProgress] = []
    after: list[JobProgress] = []  # calls once the interruption happened

    async def main() -> None:
        me = asyncio.current_task()
        assert me is not None

        def progress(p: JobProgress) -> None:
            (after if interrupted else before).append(p)
            # "loop": while the runner starts prompts; "task": when a prompt is written
            hit = (p.in_flight == 4 and p.done == 0) if where == "loop" else p.done == 2
            if interrupted or not hit:
                return
            interrupted.append(how)
            if how == "KeyboardInterrupt":
                raise KeyboardInterrupt
            if how == "CancelledError":
                raise asyncio.CancelledError
            me.cancel()

        await arun_job(prompts, _spec(), out, dpo=dpo, concurrency=4, progress=progress)

    expected = KeyboardInterrupt if how == "KeyboardInterrupt" else asyncio.CancelledError
    with pytest.raises(expected):
        asyncio.run(main())
    rows = list(read_jsonl(out)) if out.exists() else []
    assert interrupted and before
    if how == "cancel":
        assert len(after) == 1 and after[0].done == len(rows)
    else:
        assert after == []
    assert len(rows) < 12 and all(r["ok"] for r in rows)
    assert {p["key"] for p in read_jsonl(dpo)} == _pair_keys(out)
    s = run_job(prompts, _spec(), out, dpo=dpo)
    assert s.progress.skipped == len(rows) and s.progress.done == 12 - len(rows)
    assert max(_keys_once(out).values()) == 1 and len(_keys_once(out)) == 12


def test_interruption_during_the_resume_rewrite_waits_for_it(tmp_path: Path) -> None:
    """Ctrl-C while a rerun rewrites the output (dropping this job's failed lines) in a
    thread: the writers are not closed under that thread; the rewrite finishes first."""
    import fcntl
    import threading

    out = tmp_path / "out.jsonl"
    recs = [{"id": i, "prompt": f"rewrite {i}"} for i in range(3)] + [{"id": "no prompt"}]
    assert run_job(recs, _spec(), out).progress.failed == 1

    def locked() -> bool:
        fd = os.open(out, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    seen: list[bool] = []

    async def main() -> None:
        loop, me = asyncio.get_running_loop(), asyncio.current_task()
        assert me is not None

        async def nothing() -> None:
            return None

        def records() -> Any:
            # Read by the resume planner in its thread (a one-shot iterable must be listed).
            assert threading.current_thread() is not threading.main_thread()
            yield from recs
            loop.call_soon_threadsafe(me.cancel)
            for _ in range(3):  # the loop has delivered the cancellation and run on since
                asyncio.run_coroutine_threadsafe(nothing(), loop).result()
            seen.append(locked())  # the output is still open (flock held) for the rewrite

        await arun_job(records(), _spec(), out)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())
    assert seen == [True]
    assert not list(tmp_path.glob(".*.tmp"))
    rows = list(read_jsonl(out))
    assert len(rows) == 3 and all(r["ok"] for r in rows)  # the failed line was dropped
    s = run_job(recs, _spec(), out)
    assert (s.progress.skipped, s.progress.failed) == (3, 1)
    assert max(_keys_once(out).values()) == 1


# -- CLI (subprocesses: real Ctrl-C and SIGKILL) ---------------------------------------------
def _cli(*args: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    return subprocess.Popen([sys.executable, "-m", "beacon.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _wait_lines(path: Path, n: int, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {n} lines in {timeout} s")


@pytest.mark.parametrize(("sig", "family"), [(signal.SIGINT, "bernoulli"),
                                             (signal.SIGTERM, "normal"),
                                             (signal.SIGKILL, "normal")])
def test_cli_run_killed_midway_resumes_exactly_once(tmp_path: Path, sig: int,
                                                    family: str) -> None:
    n = 80
    prompts = tmp_path / "p.jsonl"
    with prompts.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "prompt": f"What is {i} + {i}?",
                                "reference": str(2 * i)}) + "\n")
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    scorer = "beacon.demo:verifier" if family == "bernoulli" else "beacon.demo:scorer"
    args = ["run", str(prompts), "-g", "beacon.demo:generator", "-s", scorer,
            "--generator-kwargs", '{"latency_ms": 15}', "--family", family, "--cost", "0.02",
            "--horizon", "12", "-j", "4", "--out", str(out), "--dpo", str(dpo)]
    proc = _cli(*args)
    _wait_lines(out, 8, timeout=90)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    if sig in (signal.SIGINT, signal.SIGTERM):
        # SIGTERM (docker stop, kubectl delete, systemd) ends the run as Ctrl-C does: the
        # summary and the resume hint; it used to kill the process without either
        assert proc.returncode == 1, err
        assert "rerun the same command" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    first = _keys_once(out)
    assert 8 <= len(first) < n and max(first.values()) == 1
    done = _cli(*args, "--json")
    stdout, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    summary = json.loads(stdout)
    assert summary["skipped"] == len(first) and summary["done"] == n - len(first)
    final = _keys_once(out)
    assert len(final) == n and max(final.values()) == 1
    assert max(_keys_once(dpo).values()) == 1 and set(_keys_once(dpo)) <= set(final)


def test_cli_run_stops_on_sigterm_with_sigint_ignored(tmp_path: Path) -> None:
    # A background job of a non-interactive shell (``beacon run ... &`` in a script) starts
    # with SIGINT ignored: SIGTERM taken as Ctrl-C must still end the run.
    prompts = _write_prompts(tmp_path / "p.jsonl", 200)
    out = tmp_path / "out.jsonl"
    proc = _cli("run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
                "--generator-kwargs", '{"latency_ms": 15}', "-j", "2", "--out", str(out),
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    _wait_lines(out, 3, timeout=90)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "rerun the same command" in err
    assert max(_keys_once(out).values()) == 1


def test_cli_usage_errors_exit_2(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beacon.cli import app

    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "o.jsonl"
    base = ["run", str(prompts), "--out", str(out)]
    cases = [
        (["-g", "beacon.demo:generator", "-s", "no_such_module_xyz:f"], "--scorer"),
        (["-g", "nocolon", "-s", "beacon.demo:scorer"], "--generator"),
        (["-g", "beacon.demo:generator", "-s", "beacon.demo:scorer", "--cost", "-1"], "--cost"),
        (["-g", "beacon.demo:generator", "-s", "beacon.demo:scorer", "--generator-kwargs",
          "[1]"], "--generator-kwargs"),
        (["-g", "beacon.demo:generator", "-s", "beacon.demo:scorer", "--dpo", str(out)],
         "--out"),
    ]
    runner = CliRunner()
    for args, option in cases:
        res = runner.invoke(app, base + args)
        assert res.exit_code == 2, (args, res.output)
        assert option in res.output, (args, res.output)
    assert not out.exists()
    res = runner.invoke(app, ["run", str(tmp_path / "nope.jsonl"), "-g", "beacon.demo:generator",
                              "-s", "beacon.demo:scorer", "--out", str(out)])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_cli_run_with_fitted_prior_file_equals_python_api(tmp_path: Path) -> None:
    import numpy as np
    from typer.testing import CliRunner

    from beacon import demo
    from beacon.cli import app
    from beacon.fitting import fit_reward_model

    # The same calibration data as tests/test_worker.py, so the h-table is built once.
    sc = demo.scorer(seed=3)
    logged = np.array([[sc.reward(f"calibration prompt {i}", f"response {j}") for j in range(12)]
                       for i in range(40)])
    fit = fit_reward_model(logged, family="normal", transform="gaussianize")
    fit.save(tmp_path / "prior.json")
    prompts = _write_prompts(tmp_path / "p.jsonl", 30)
    res = CliRunner().invoke(app, [
        "run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
        "--generator-kwargs", '{"seed": 3}', "--scorer-kwargs", '{"seed": 3}',
        "--prior", str(tmp_path / "prior.json"), "--cost", "0.05", "--horizon", "16",
        "--out", str(tmp_path / "cli.jsonl"), "--json"])
    assert res.exit_code == 0, res.output
    spec = JobSpec(FactorySpec("beacon.demo:generator", {"seed": 3}),
                   FactorySpec("beacon.demo:scorer", {"seed": 3}),
                   fit.config(cost=0.05, horizon=16))
    run_job(prompts, spec, tmp_path / "api.jsonl")

    def core(p: Path) -> dict[str, tuple[Any, ...]]:
        return {r["key"]: (r["best"], r["reward"], r["n_samples"], r["stop_reason"])
                for r in read_jsonl(p)}

    # Equal keys: the CLI built the very same config (fitted prior and transform included).
    assert core(tmp_path / "cli.jsonl") == core(tmp_path / "api.jsonl")
    assert len(core(tmp_path / "api.jsonl")) == 30


def test_cli_config_file_with_overrides(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from beacon.cli import app

    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(beacon.BeaconConfig(family="bernoulli", cost=0.02,
                                                       horizon=10).to_dict()))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"{i}*2?", "reference": str(2 * i)})
                               + "\n" for i in range(6)))
    res = CliRunner().invoke(app, ["run", str(prompts), "-g", "beacon.demo:generator", "-s",
                                   "beacon.demo:verifier", "--config", str(cfg_file),
                                   "--horizon", "12", "--out", str(tmp_path / "cli.jsonl")])
    assert res.exit_code == 0, res.output
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:verifier"),
                   beacon.BeaconConfig(family="bernoulli", cost=0.02, horizon=12))
    want = {prompt_key(r, spec) for r in iter_prompt_file(prompts)
            if isinstance(r, PromptRecord)}
    assert {r["key"] for r in read_jsonl(tmp_path / "cli.jsonl")} == want


# -- docs/bulk.md says what the code does ----------------------------------------------------------
BULK_DOC = ROOT / "docs" / "bulk.md"


def _doc_json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object of the ```json blocks of a Markdown text (blocks may be indented)."""
    import re

    objs: list[dict[str, Any]] = []
    dec = json.JSONDecoder()
    for m in re.finditer(r"^([ \t]*)```json\n(.*?)^\1```", text, flags=re.M | re.S):
        body = "\n".join(line[len(m[1]):] for line in m[2].splitlines())
        i = 0
        while True:
            while i < len(body) and body[i].isspace():
                i += 1
            if i >= len(body):
                break
            obj, i = dec.raw_decode(body, i)
            objs.append(obj)
    return objs


def test_bulk_doc_shows_the_lines_of_prompts_that_never_ran_as_written(tmp_path: Path) -> None:
    # The reviewer's reproduction: a prompt the verifier rejects, a line that is not JSON.
    from typer.testing import CliRunner

    from beacon import STOP_REASONS
    from beacon.cli import app

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id":"m99","prompt":"What is 2+2?"}\nnot json\n')
    res = CliRunner().invoke(app, ["run", str(bad), "--family", "bernoulli", "-g",
                                   "beacon.demo:generator", "-s", "beacon.demo:verifier",
                                   "--out", str(tmp_path / "o.jsonl"), "--json"])
    assert res.exit_code == 1, res.output
    assert json.loads(res.stdout)["stop_reasons"] == {"input-error": 2}
    written = {r["line"]: {k: v for k, v in r.items() if k != "key"}
               for r in read_jsonl(tmp_path / "o.jsonl")}
    text = BULK_DOC.read_text()
    shown = {o["line"]: {k: v for k, v in o.items() if k != "key"}
             for o in _doc_json_objects(text) if o.get("ok") is False}
    assert shown == written  # the page shows exactly these two lines (keys aside)
    for line in written.values():
        assert "stop_reason" not in line and isinstance(line["error"], dict)
    # The ok line's keys are those of the page's example.
    ok_doc = next(o for o in _doc_json_objects(text) if o.get("ok") is True)
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "q01", "prompt": "a", "metadata": {"source": "demo"}}\n')
    run_job(p, _spec(), tmp_path / "ok.jsonl", fsync=False)
    (ok_line,) = read_jsonl(tmp_path / "ok.jsonl")
    assert list(ok_line) == list(ok_doc)
    # Every stop reason the summary can count is named on the page.
    for reason in (*STOP_REASONS, "input-error"):
        assert f"`{reason}`" in text, reason


def test_bulk_doc_names_every_option_of_the_job_commands() -> None:
    import re

    import typer

    from beacon.cli import app

    text = BULK_DOC.read_text()
    group = typer.main.get_command(app)
    missing = []
    for name in ("run", "submit", "status", "collect", "worker"):
        for p in group.commands[name].params:  # type: ignore[attr-defined]
            if p.param_type_name != "option":
                continue
            names = [o for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
            if not any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in names):
                missing.append(f"beacon {name} {names[0]}")
    assert not missing, f"docs/bulk.md does not mention: {missing}"


def test_bench_worker_command_is_the_same_in_readme_and_bulk_doc() -> None:
    cmd = "python -m bench.bench_worker"
    assert cmd in BULK_DOC.read_text() and cmd in (ROOT / "README.md").read_text()
    assert "bench/bench_worker.py" not in BULK_DOC.read_text()
