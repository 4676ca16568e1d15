"""Bulk jobs from a demanding user's side: foreign files given as outputs, misbehaving factories,
blocking clients, huge input lines, special files."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

# the job and prompts builders of the main jobs tests (pytest puts tests/ on sys.path)
from test_jobs import _spec, _write_prompts

import beacon
from beacon.jobs import (
    FactorySpec,
    JobInputError,
    JobSpec,
    KeyedJsonlWriter,
    OutputError,
    read_jsonl,
    run_job,
)

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str) -> Any:
    from typer.testing import CliRunner

    from beacon.cli import app

    return CliRunner().invoke(app, list(args))


# -- an existing file that is not an output of the job is never truncated ---------------------
@pytest.mark.parametrize("content", [
    # another prompts file (or any JSONL dataset without a "key")
    b'{"id": "m01", "prompt": "What is 17 * 23?", "reference": "391"}\n'
    b'{"id": "m02", "prompt": "What is 2 + 2?", "reference": "4"}\n',
    b"id,prompt\n1,hello\n",  # a CSV
    b'{"cost": 0.1, "horizon": 8}',  # a one-line JSON file written without its newline
    b"some notes\nwithout a newline at the end",
])
def test_a_file_that_is_not_a_job_output_is_refused_and_left_intact(
    tmp_path: Path, content: bytes
) -> None:
    """Given as --out (or --dpo) by mistake, another program's file used to be taken for a
    torn tail and truncated to nothing on open -- the user's data gone, silently."""
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    for role in ("out", "dpo"):
        victim = tmp_path / f"victim-{role}.jsonl"
        victim.write_bytes(content)
        kwargs: dict[str, Any] = {"dpo": victim} if role == "dpo" else {}
        out = victim if role == "out" else tmp_path / "o.jsonl"
        with pytest.raises(OutputError, match="line 1 is not a JSON record"):
            run_job(prompts, _spec(), out, **kwargs)
        assert victim.read_bytes() == content
    victim = tmp_path / "victim-cli.jsonl"
    victim.write_bytes(content)
    res = _cli("run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
               "--out", str(victim))
    assert res.exit_code == 1, res.output
    assert "is not a JSON record" in res.output and "Traceback" not in res.output
    assert victim.read_bytes() == content


def test_torn_tails_are_still_cut_off(tmp_path: Path) -> None:
    """What a killed append or a power loss leaves at the end is still recovered."""
    # the last: a power loss left the first block of the final append unwritten (zeros) and
    # its end, newline included, on disk
    for tail in (b'{"key": "c", "v":', b'{"ke', b"\x00\x00\x00\x00", b"   ",
                 b"\x00" * 8 + b'"v": 1}\n'):
        p = tmp_path / "out.jsonl"
        p.write_bytes(b'{"key": "a"}\n' + tail)
        with KeyedJsonlWriter(p) as w:
            assert w.keys == {"a"} and w.recovered_bytes == len(tail)
        assert p.read_bytes() == b'{"key": "a"}\n'
        # the first record of a new output torn: nothing else in the file
        p.write_bytes(tail)
        with KeyedJsonlWriter(p) as w:
            assert not w.keys and w.recovered_bytes == len(tail)
        assert p.read_bytes() == b""
    # a whole line that is not a record at the end is not a torn write: refused, kept
    p.write_bytes(b'{"key": "a"}\n{"note": "added by hand"}\n')
    with pytest.raises(OutputError, match="line 2"):
        KeyedJsonlWriter(p).open()
    assert p.read_bytes() == b'{"key": "a"}\n{"note": "added by hand"}\n'
    assert [r["key"] for r in read_jsonl(tmp_path / "out.jsonl") if "key" in r] == ["a"]


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    """Write an importable factories module ``name`` (unique per test) and return its name."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


# -- blocking (sync) clients run in threads: concurrency and the timeout hold -----------------
_BLOCKING = """
import importlib
import threading

lock = threading.Lock()
calls = []
overlapped = []  # what the first call saw: True when a second call started meanwhile
second_call = threading.Event()
release = threading.Event()


def generate(prompt):
    with lock:
        calls.append(prompt)
        first = len(calls) == 1
    if first:
        # inline on the event loop, no other call can start while this one blocks
        overlapped.append(second_call.wait(20))
    else:
        second_call.set()
    return "answer to " + str(prompt)


def overlapping():
    return generate


def stuck_generate(prompt):
    release.wait(20)  # a client without its own timeout, blocked
    return "late answer to " + str(prompt)


def stuck():
    return stuck_generate
"""


def test_sync_generator_calls_run_concurrently_with_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync client (requests, openai.OpenAI) could only be called inline on the event loop:
    every call of the job ran one after the other, whatever the concurrency options said.
    ``offload_sync=True`` (``beacon run --threads``) runs its calls in threads."""
    import importlib

    mod = _module(tmp_path, monkeypatch, "blocking_overlap", _BLOCKING)
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    spec = JobSpec(FactorySpec(f"{mod}:overlapping"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.05, horizon=4))
    s = run_job(prompts, spec, tmp_path / "o.jsonl", concurrency=2, offload_sync=True)
    assert s.progress.done == 2
    assert importlib.import_module(mod).overlapped == [True]


_MAIN_THREAD = """
import threading

threads = set()


def score(prompt, text):
    threads.add(threading.current_thread() is threading.main_thread())
    return float(len(text))


def scorer():
    return score
"""


@pytest.mark.parametrize("cli", [False, True])
def test_sync_calls_stay_on_the_main_thread_unless_threads_are_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: bool
) -> None:
    # Threads by default broke thread-unsafe clients (a local model) and scorers that need the
    # main thread (signal-based timeouts, as math-verify's): they are opt-in.
    import importlib

    mod = _module(tmp_path, monkeypatch, f"main_thread_{int(cli)}", _MAIN_THREAD)
    prompts = _write_prompts(tmp_path / "p.jsonl", 3)
    out = tmp_path / "o.jsonl"
    if cli:
        from typer.testing import CliRunner

        from beacon.cli import app

        for extra, want in (([], {True}), (["--threads"], {False})):
            importlib.import_module(mod).threads.clear()
            res = CliRunner().invoke(app, ["run", str(prompts), "-g", "beacon.demo:generator",
                                           "-s", f"{mod}:scorer", "-o", str(out), *extra])
            assert res.exit_code == 0, res.output
            assert importlib.import_module(mod).threads == want
            out.unlink()
    else:
        spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec(f"{mod}:scorer"),
                       beacon.BeaconConfig(cost=0.05, horizon=4))
        assert run_job(prompts, spec, out).progress.done == 3
        assert importlib.import_module(mod).threads == {True}


def test_sync_generator_that_blocks_is_timed_out(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-call timeout did not apply to a sync client: one that never returned hung the
    job forever (here it would block 20 s per call, then succeed)."""
    import importlib

    mod = _module(tmp_path, monkeypatch, "blocking_stuck", _BLOCKING)
    prompts = _write_prompts(tmp_path / "p.jsonl", 1)
    spec = JobSpec(FactorySpec(f"{mod}:stuck"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.05, horizon=4),
                   {"timeout": 0.5, "max_attempts": 1})
    out = tmp_path / "o.jsonl"
    try:
        s = run_job(prompts, spec, out, offload_sync=True)
    finally:
        importlib.import_module(mod).release.set()  # let the abandoned threads end
    assert (s.progress.done, s.progress.failed) == (0, 1)
    (line,) = read_jsonl(out)
    assert line["ok"] is False and "Timeout" in line["error"]["message"]


# -- factories: built once, errors typed and naming them, the command line's own trusted ------
_FACTORIES = """
import functools
import os

built = []
closed = []


class Generator:
    def __init__(self, tag):
        built.append(tag)
        self.tag = tag

    async def __call__(self, prompt):
        return f"{self.tag}: an answer to {prompt}"

    async def aclose(self):
        closed.append(self.tag)


def generator(tag="g"):
    return Generator(tag)


def needs_key():
    return Generator(os.environ["BEACON_TEST_NO_SUCH_KEY"])  # a missing API key


def broken():
    raise RuntimeError("the model server is unreachable")


def nothing():
    return None


partial_generator = functools.partial(generator, tag="partial")
"""


def test_factory_that_fails_is_a_usage_error_or_a_typed_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A factory raising anything but a TypeError (a missing API key) gave a traceback."""
    mod = _module(tmp_path, monkeypatch, "audit_factories_fail", _FACTORIES)
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "o.jsonl"
    for factory, words in (("needs_key", "BEACON_TEST_NO_SUCH_KEY"),
                           ("broken", "the model server is unreachable"),
                           ("nothing", "returned None")):
        res = _cli("run", str(prompts), "-g", f"{mod}:{factory}", "-s", "beacon.demo:scorer",
                   "--out", str(out))
        assert res.exit_code == 2, (factory, res.output, res.exception)
        assert "--generator" in res.output and f"{mod}:{factory}" in res.output
        assert words in res.output and "Traceback" not in res.output
        assert not out.exists()
    # named by a prompt line: that prompt fails with an error naming the field and the factory
    p2 = tmp_path / "p2.jsonl"
    p2.write_text(json.dumps({"id": "x", "prompt": "hi", "generator": f"{mod}:broken"}) + "\n"
                  + json.dumps({"id": "y", "prompt": "hello"}) + "\n")
    s = run_job(p2, _spec(), out)
    assert (s.progress.done, s.progress.failed) == (1, 1)
    bad = next(r for r in read_jsonl(out) if r["id"] == "x")
    assert bad["error"]["type"] == "JobInputError"
    assert (bad["error"]["field"], bad["error"]["value"]) == ("generator", f"{mod}:broken")
    assert "RuntimeError: the model server is unreachable" in bad["error"]["message"]
    with pytest.raises(JobInputError) as e:
        FactorySpec(f"{mod}:nothing").build(None, role="generator")
    assert (e.value.field, e.value.value) == ("generator", f"{mod}:nothing")


def test_cli_builds_its_factories_once_and_closes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command built each job-level factory twice: once to check it (never closed: an
    HTTP session left open, a local model loaded twice), once more for the prompts."""
    import importlib

    mod = _module(tmp_path, monkeypatch, "audit_factories_once", _FACTORIES)
    prompts = _write_prompts(tmp_path / "p.jsonl", 3)
    res = _cli("run", str(prompts), "-g", f"{mod}:generator", "-s", "beacon.demo:scorer",
               "--out", str(tmp_path / "o.jsonl"))
    assert res.exit_code == 0, (res.output, res.exception)
    m = importlib.import_module(mod)
    assert m.built == ["g"] and m.closed == ["g"]


def test_cli_trusts_the_factories_it_was_given(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A factory typed on the command line that its module re-exports from another one (or a
    functools.partial) passed the up-front check, then every prompt failed: the allow-list
    meant for prompt lines refused it. Prompt lines naming other modules are still refused."""
    base = _module(tmp_path, monkeypatch, "audit_factories_base", _FACTORIES)
    mod = _module(tmp_path, monkeypatch, "audit_factories_reexport",
                  f"from {base} import generator, partial_generator\n")
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    for factory in ("generator", "partial_generator"):
        out = tmp_path / f"o-{factory}.jsonl"
        res = _cli("run", str(prompts), "-g", f"{mod}:{factory}", "-s", "beacon.demo:scorer",
                   "--out", str(out))
        assert res.exit_code == 0, (factory, res.output, [r["error"] for r in read_jsonl(out)])
        assert [r["ok"] for r in read_jsonl(out)] == [True, True]
    p2 = tmp_path / "p2.jsonl"
    p2.write_text(json.dumps({"id": "x", "prompt": "hi", "generator": f"{base}:generator"})
                  + "\n")
    out = tmp_path / "o2.jsonl"
    res = _cli("run", str(p2), "-g", f"{mod}:generator", "-s", "beacon.demo:scorer",
               "--out", str(out))
    assert res.exit_code == 1
    (line,) = read_jsonl(out)
    assert line["error"]["type"] == "FactoryNotAllowedError"


# -- huge input lines, special files --------------------------------------------------------------
def test_error_line_of_a_huge_bad_value_stays_small(tmp_path: Path) -> None:
    """A bad 1 MB message list (or metadata, or unknown field) was quoted whole, twice (in the
    message and in "value"): its error line was twice the size of the input line."""
    big = ["x" * 1000] * 1000
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": 1, "prompt": big}, {"id": 2, "prompt": "hi", "metadata": big},
            {"id": 3, "prompt": "hi", "extra": {"blob": big}}]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "o.jsonl"
    s = run_job(prompts, _spec(), out)
    assert s.progress.failed == 3
    lines = out.read_text().splitlines()
    assert len(lines) == 3
    for text in lines:
        err = json.loads(text)["error"]
        assert err["field"] in ("prompt", "metadata", "extra")
        assert "xxxx" in err["message"] and "line " in err["message"]
        assert len(text) < 2000, len(text)


@pytest.mark.parametrize("special", ["/dev/null", "/dev/zero"])
def test_special_files_are_refused_before_anything_runs(tmp_path: Path, special: str) -> None:
    """--out /dev/null failed with a bare "[Errno 22] Invalid argument" once the first prompt
    was paid for (fsync), /dev/zero as an output was read forever; a pipe as PROMPTS was
    "no such file"."""
    if not Path(special).exists():
        pytest.skip(f"no {special}")
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    out = tmp_path / "o.jsonl"
    for field in ("out", "dpo", "prompts"):
        args: dict[str, Any] = {"prompts": prompts, "out": out, field: special}
        with pytest.raises(JobInputError, match="not a regular file") as e:
            run_job(args.pop("prompts"), _spec(), args.pop("out"), **args)
        assert e.value.field == field
        cli = {"out": [str(prompts), "--out", special],
               "dpo": [str(prompts), "--out", str(out), "--dpo", special],
               "prompts": [special, "--out", str(out)]}[field]
        res = _cli("run", *cli, "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer")
        assert res.exit_code == 2, (field, res.output, res.exception)
        assert "not a regular file" in res.output
    assert not out.exists()
    res = _cli("run", str(prompts), "--out", str(tmp_path), "-g", "beacon.demo:generator",
               "-s", "beacon.demo:scorer")
    assert res.exit_code == 2 and "is a directory" in res.output, res.output


_BINDS = """
class NeedsReference:
    def bind(self, record):
        reference = record["reference"]  # a record without one: KeyError

        async def score(prompt, response):
            return float(str(reference) in response)
        return score


def needs_reference():
    return NeedsReference()
"""


def test_bind_that_rejects_a_record_fails_it_with_a_typed_error_and_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bind(record) raising KeyError('reference') gave the line {"type": "KeyError",
    "message": "'reference'"} (which factory? which field?) and logged a traceback per
    prompt."""
    mod = _module(tmp_path, monkeypatch, "audit_binds", _BINDS)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "2+2?", "reference": "4"}) + "\n"
                       + json.dumps({"id": "b", "prompt": "3+3?"}) + "\n")
    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec(f"{mod}:needs_reference"),
                   beacon.BeaconConfig(family="bernoulli", cost=0.05, horizon=4))
    out = tmp_path / "o.jsonl"
    with caplog.at_level("WARNING"):
        s = run_job(prompts, spec, out)
    assert (s.progress.done, s.progress.failed) == (1, 1)
    bad = next(r for r in read_jsonl(out) if r["id"] == "b")
    assert bad["error"]["type"] == "JobInputError"
    assert (bad["error"]["field"], bad["error"]["value"]) == ("scorer", f"{mod}:needs_reference")
    assert "bind(record) raised KeyError" in bad["error"]["message"]
    assert not [r for r in caplog.records if r.exc_info], caplog.text


def test_cli_output_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    """An --out (or --dpo) in a folder that cannot be created was an exit-1 OS error, after the
    factories were built; it is a usage error (exit 2) like a missing input file."""
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    for option in ("--out", "--dpo"):
        paths = {"--out": str(tmp_path / "o.jsonl"), "--dpo": str(tmp_path / "d.jsonl")}
        paths[option] = "/proc/beacon-no-such-dir/x.jsonl"
        res = _cli("run", str(prompts), "-g", "beacon.demo:generator", "-s",
                   "beacon.demo:scorer", *[a for k, v in paths.items() for a in (k, v)])
        assert res.exit_code == 2, (option, res.output, res.exception)
        assert option in res.output and "cannot write it" in res.output
    assert not (tmp_path / "o.jsonl").exists()


# -- DPO pairs of chat prompts ---------------------------------------------------------------
def test_dpo_pairs_of_chat_prompts_are_in_trls_conversational_format(tmp_path: Path) -> None:
    """A prompt given as chat messages got its pair with chosen / rejected as plain strings:
    TRL (apply_chat_template) concatenates prompt + chosen, list + str -- every such pair
    failed. Both sides are now one assistant message, as TRL's conversational format has it."""
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Explain why the sky is blue."}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "chat", "prompt": messages}) + "\n"
                       + json.dumps({"id": "text", "prompt": "Explain tides."}) + "\n")
    out, dpo = tmp_path / "o.jsonl", tmp_path / "d.jsonl"
    run_job(prompts, _spec(), out, dpo=dpo)
    lines = {r["id"]: r for r in read_jsonl(out)}
    pairs = {p["id"]: p for p in read_jsonl(dpo)}
    assert set(pairs) == {"chat", "text"}
    chat = pairs["chat"]
    assert chat["prompt"] == messages
    assert chat["chosen"] == [{"role": "assistant", "content": lines["chat"]["best"]}]
    assert isinstance(chat["rejected"], list) and chat["rejected"][0]["role"] == "assistant"
    for side in ("chosen", "rejected"):  # what TRL does with a conversational pair
        convo = chat["prompt"] + chat[side]
        assert all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in convo)
    # a text prompt keeps plain strings (TRL's standard format)
    assert pairs["text"]["chosen"] == lines["text"]["best"]
    assert isinstance(pairs["text"]["rejected"], str)


def test_a_dpo_file_keeps_the_chat_format_it_was_begun_in(tmp_path: Path) -> None:
    # A chat job resumed by this version on a DPO file begun by an older one (plain-string
    # sides), or pairs of old workers collected into a new file, mixed strings and message
    # lists in one column, which a dataset loader cannot read.
    from beacon.jobs.dpo import DpoWriter

    chat = [{"role": "user", "content": "hi"}]
    old_pair = {"key": "k1", "id": 1, "prompt": chat, "chosen": "a", "rejected": "b"}
    new_pair = {"key": "k2", "id": 2, "prompt": chat,
                "chosen": [{"role": "assistant", "content": "c"}],
                "rejected": [{"role": "assistant", "content": "d"}]}
    text_pair = {"key": "k3", "id": 3, "prompt": "plain", "chosen": "e", "rejected": "f"}

    old_file = tmp_path / "old.jsonl"
    old_file.write_text(json.dumps(old_pair) + "\n")
    with DpoWriter(old_file) as w:
        assert w.write_pair(new_pair) and w.write_pair(text_pair)
    rows = {r["key"]: r for r in read_jsonl(old_file)}
    assert (rows["k2"]["chosen"], rows["k2"]["rejected"]) == ("c", "d")
    assert rows["k3"]["chosen"] == "e"

    new_file = tmp_path / "new.jsonl"
    with DpoWriter(new_file) as w:
        assert w.write_pair(new_pair) and w.write_pair(old_pair)
    rows = {r["key"]: r for r in read_jsonl(new_file)}
    assert rows["k1"]["chosen"] == [{"role": "assistant", "content": "a"}]
    assert rows["k1"]["rejected"] == [{"role": "assistant", "content": "b"}]
    assert rows["k2"]["chosen"] == new_pair["chosen"]


# -- an interruption does not wait for a table build ----------------------------------------------
def test_interrupted_run_does_not_wait_for_the_table_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first table of a new prior takes up to minutes to build, before any prompt runs;
    Ctrl-C then waited for the build to end (asyncio.run joins the threads of its executor)."""
    import asyncio
    import threading

    import beacon.jobs.local as local
    from beacon.jobs import arun_job

    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow_prepare(cfg: Any) -> None:
        started.set()
        release.wait(30)  # a build that is still running when the user interrupts
        finished.append(True)

    monkeypatch.setattr(local, "prepare_config", slow_prepare)
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)

    async def main() -> None:
        task = asyncio.ensure_future(arun_job(prompts, _spec(), tmp_path / "o.jsonl"))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())  # returns once the run has unwound, not when the build ends
        assert not finished
    finally:
        release.set()
    assert not list(read_jsonl(tmp_path / "o.jsonl"))


def test_an_executor_of_another_spec_is_refused(tmp_path: Path) -> None:
    """run_job(..., executor=) ran the executor's own spec (factories, config) and filed the
    results under the keys of ``spec``: another job's results, skipped as done on every rerun."""
    from beacon.jobs import PromptExecutor

    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    other = PromptExecutor(_spec(cost=0.5), allowed=None)
    with pytest.raises(beacon.ConfigError) as e:
        run_job(prompts, _spec(), tmp_path / "o.jsonl", executor=other)
    assert e.value.field == "executor"
    assert not (tmp_path / "o.jsonl").exists()
    same = PromptExecutor(_spec(), allowed=None)
    assert run_job(prompts, _spec(), tmp_path / "o.jsonl", executor=same).progress.done == 2


_CLIENTS = """
import asyncio

N = 6
called = set()
everyone_called = asyncio.Event()
closes = []


class Client:
    def __init__(self, tag):
        self.tag = tag
        self.closed = False

    async def __call__(self, prompt):
        called.add(self.tag)
        if len(called) >= N:
            everyone_called.set()
        await everyone_called.wait()  # every prompt is in flight, every client built
        if self.closed:
            raise RuntimeError(f"client {self.tag} is closed")
        return f"{self.tag}: an answer to {prompt}"

    async def aclose(self):
        self.closed = True
        closes.append(self.tag)


def client(tag):
    return Client(tag)
"""


def test_factory_cache_never_closes_an_object_a_running_prompt_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-prompt overrides with more distinct factories than the cache holds: the least
    recently used one was closed (its HTTP session gone) while its prompt was still running,
    and that prompt failed. It is closed when its last prompt is done, once."""
    import importlib

    from beacon.jobs import FactoryCache, PromptExecutor

    mod = _module(tmp_path, monkeypatch, "audit_clients", _CLIENTS)
    m = importlib.import_module(mod)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(
        json.dumps({"id": i, "prompt": f"q{i}",
                    "generator": {"factory": f"{mod}:client", "kwargs": {"tag": f"t{i}"}}})
        + "\n" for i in range(m.N)))
    spec = JobSpec(FactorySpec(f"{mod}:client", {"tag": "job"}), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.05, horizon=4), {"max_attempts": 1})
    ex = PromptExecutor(spec, allowed=None, cache=FactoryCache(None, max_size=2))
    out = tmp_path / "o.jsonl"

    async def main() -> Any:
        from beacon.jobs import arun_job

        try:
            return await arun_job(prompts, spec, out, concurrency=m.N, executor=ex)
        finally:
            await ex.aclose()

    import asyncio

    s = asyncio.run(main())
    errors = [r["error"] for r in read_jsonl(out) if not r["ok"]]
    assert (s.progress.done, s.progress.failed) == (m.N, 0), errors
    assert sorted(m.closes) == sorted(f"t{i}" for i in range(m.N))  # each closed once


def test_output_and_dpo_file_swapped_on_a_rerun_are_refused_intact(tmp_path: Path) -> None:
    """`--out dpo.jsonl --dpo out.jsonl` on a rerun: the output's lines were taken for pairs
    without an output line and deleted (here most of the results: the prompts whose rewards
    were all equal have no pair), and output lines were appended to the DPO file."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"What is {i} + {i}?",
                                           "reference": str(2 * i)}) + "\n" for i in range(30)))
    spec = _spec(family="bernoulli")
    spec = JobSpec(spec.generator, FactorySpec("beacon.demo:verifier"), spec.config)
    out, dpo = tmp_path / "out.jsonl", tmp_path / "dpo.jsonl"
    run_job(prompts, spec, out, dpo=dpo)
    before = (out.read_bytes(), dpo.read_bytes())
    n_out, n_dpo = len(before[0].splitlines()), len(before[1].splitlines())
    assert n_out == 30 and 0 < n_dpo < n_out  # some prompts have no pair
    with pytest.raises(OutputError, match="swapped"):
        run_job(prompts, spec, dpo, dpo=out)
    assert (out.read_bytes(), dpo.read_bytes()) == before
    res = _cli("run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:verifier",
               "--family", "bernoulli", "--cost", "0.05", "--horizon", "16",
               "--generator-kwargs", '{"seed": 1}', "--out", str(dpo), "--dpo", str(out))
    assert res.exit_code == 1 and "swapped" in res.output, res.output
    assert (out.read_bytes(), dpo.read_bytes()) == before


def test_cli_prompts_from_stdin_says_it_is_not_supported(tmp_path: Path) -> None:
    """`beacon run - ...` said "file '-' does not exist"."""
    res = _cli("run", "-", "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
               "--out", str(tmp_path / "o.jsonl"))
    assert res.exit_code == 2 and "stdin" in res.output, res.output


def test_a_rerun_with_changed_options_says_the_old_lines_are_another_jobs(tmp_path: Path) -> None:
    """Rerunning into the same --out with another --cost ran every prompt again next to the
    old lines (new keys) and said only "0 skipped": not that the output (and the DPO file)
    now holds two results per prompt."""
    prompts = _write_prompts(tmp_path / "p.jsonl", 4)
    out = tmp_path / "o.jsonl"
    base = ["run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
            "--out", str(out)]
    assert _cli(*base).exit_code == 0
    again = _cli(*base, "--json")
    assert json.loads(again.stdout)["other_lines"] == 0
    res = _cli(*base, "--cost", "0.3")
    assert res.exit_code == 0, res.output
    assert "also holds 4 line(s) that are not this job's" in res.output
    res = _cli(*base, "--cost", "0.3", "--json")
    summary = json.loads(res.stdout)
    assert (summary["skipped"], summary["other_lines"]) == (4, 4)
    s = run_job(prompts, _spec(cost=0.7), out)
    assert (s.progress.done, s.progress.other_lines) == (4, 8)


def test_cli_run_off_a_terminal_writes_nothing_but_the_summary(tmp_path: Path) -> None:
    """Off a terminal (a log file, CI) the progress bar is not drawn, but it left a stray blank
    line on stderr at every run."""
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    res = _cli("run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer",
               "--out", str(tmp_path / "o.jsonl"))
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert res.stdout.startswith("2 ok, 0 failed") and res.stdout.count("\n") == 1


def test_timeout_zero_means_no_limit_per_call(tmp_path: Path) -> None:
    # A client with its own (longer) timeouts could not be run without BEACON's 60 s per call:
    # --timeout had no "no limit" and 0 was refused.
    import asyncio

    from typer.testing import CliRunner

    from beacon.cli import app
    from beacon.jobs.execute import PromptExecutor

    spec = JobSpec(FactorySpec("beacon.demo:generator"), FactorySpec("beacon.demo:scorer"),
                   beacon.BeaconConfig(cost=0.05, horizon=4), {"timeout": 0})
    ex = PromptExecutor(spec, allowed=None)
    assert ex.timeout is None
    asyncio.run(ex.aclose())
    assert PromptExecutor(_spec(), allowed=None).timeout == 60.0
    prompts = _write_prompts(tmp_path / "p.jsonl", 2)
    base = ["run", str(prompts), "-g", "beacon.demo:generator", "-s", "beacon.demo:scorer"]
    ok = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "a.jsonl"), "--timeout", "0"])
    assert ok.exit_code == 0, ok.output
    bad = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "b.jsonl"), "--timeout", "-1"])
    assert bad.exit_code == 2 and "--timeout" in bad.output
