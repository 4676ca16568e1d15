"""Review 5 of the fitting / integrations commits: parsed LangChain outputs with a ``text`` or
``content`` field, LlamaIndex prompt-cache tokens, pandas date / complex columns and ``pd.NA``
in per-prompt lists, the needless refit at alpha0's bound, and ``fit_prior``'s note."""

from __future__ import annotations

import asyncio
import json
import warnings
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import beacon.fitting as fitting
from beacon.errors import ConfigError
from beacon.evaluation import logged_from_records
from beacon.fitting import fit_prior, fit_reward_model, reward_matrix
from beacon.transforms import as_reward_array, table_values


# ----------------------------------------------------------------------------------------------
# 1. LangChain: a parsed pydantic output with a text / content field is scored as its JSON
# ----------------------------------------------------------------------------------------------
def _lc_models() -> tuple[type[Any], type[Any]]:
    pydantic = pytest.importorskip("pydantic")

    class WithText(pydantic.BaseModel):
        text: str
        confidence: float

    class WithContent(pydantic.BaseModel):
        content: str
        confidence: float

    return WithText, WithContent


@pytest.mark.parametrize("field_name", ["text", "content"])
def test_pydantic_output_with_text_or_content_field_is_scored_as_json(field_name: str) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.output_parsers import PydanticOutputParser

    from beacon import BeaconConfig
    from beacon_integrations.langchain import BeaconRunnable

    model_cls = dict(zip(["text", "content"], _lc_models(), strict=True))[field_name]
    replies = [json.dumps({field_name: "Lyon", "confidence": 0.2}),
               json.dumps({field_name: "Paris", "confidence": 0.9})] * 3
    seen: list[str] = []

    def score(prompt: str, response: str) -> float:
        seen.append(response)
        return float(json.loads(response)["confidence"])  # the field alone is no JSON object

    chain = FakeListChatModel(responses=replies) | PydanticOutputParser(pydantic_object=model_cls)
    runnable = BeaconRunnable(
        model=chain,
        scorer=score, config=BeaconConfig(cost=0.01, horizon=4, family="normal"),
        return_result=True,
    )
    res = runnable.invoke("q")
    assert res.error is None
    assert seen and all(json.loads(r)[field_name] in ("Lyon", "Paris") for r in seen)
    assert isinstance(res.best.raw, model_cls)


def test_lc_generation_order_text_message_structured_then_other_shapes() -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage
    from pydantic import BaseModel

    from beacon_integrations._adapt import _lc_generation

    with_text, _ = _lc_models()
    assert _lc_generation("plain").text == "plain"
    assert _lc_generation(AIMessage(content="hi")).text == "hi"
    assert json.loads(_lc_generation(with_text(text="a", confidence=0.5)).text) == {
        "text": "a", "confidence": 0.5}
    assert json.loads(_lc_generation({"content": "a", "x": 1}).text) == {"content": "a", "x": 1}
    # a LlamaIndex-like response object (no model, no mapping) is still read by its text
    assert _lc_generation(SimpleNamespace(text="resp")).text == "resp"

    class Message(BaseModel):  # stands in for an Anthropic SDK Message (a pydantic model)
        content: str

    Message.__module__ = "anthropic.types.message"
    assert _lc_generation(Message(content="sdk reply")).text == "sdk reply"


# ----------------------------------------------------------------------------------------------
# 2. LlamaIndex: Anthropic prompt-cache tokens in raw["usage"]
# ----------------------------------------------------------------------------------------------
_ANTHROPIC_USAGE = {"input_tokens": 10, "output_tokens": 5,
                    "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200}


@pytest.mark.parametrize("raw", [
    {"id": "msg", "usage": _ANTHROPIC_USAGE},
    SimpleNamespace(usage=SimpleNamespace(**_ANTHROPIC_USAGE)),
])
def test_li_tokens_count_anthropic_cache_tokens(raw: Any) -> None:
    from beacon_integrations._adapt import _li_counts

    resp = SimpleNamespace(additional_kwargs={}, raw=raw)
    tokens = tuple(_li_counts(resp)[:4])
    assert tokens[:2] == (10 + 1000 + 200, 5)
    assert tokens[2:] == (1000, 200)


def test_li_tokens_additional_kwargs_and_openai_usage_still_read() -> None:
    from beacon_integrations._adapt import _li_counts

    kw = SimpleNamespace(additional_kwargs={"prompt_tokens": 7, "completion_tokens": 3}, raw=None)
    assert tuple(_li_counts(kw)[:4])[:2] == (7, 3)
    oa = SimpleNamespace(additional_kwargs={},
                         raw={"usage": {"prompt_tokens": 8, "completion_tokens": 2}})
    assert tuple(_li_counts(oa)[:4])[:2] == (8, 2)
    none = SimpleNamespace(additional_kwargs={"prompt_tokens": True}, raw={})
    assert tuple(_li_counts(none)[:4])[:2] == (None, None)


def test_li_generate_llm_keeps_the_cache_split_on_the_generation() -> None:
    from beacon_integrations._adapt import LIQuery, li_generate_llm

    async def acomplete(prompt: Any, formatted: bool = False) -> Any:
        return SimpleNamespace(text="answer", additional_kwargs={},
                               raw={"usage": dict(_ANTHROPIC_USAGE)})

    llm = SimpleNamespace(metadata=SimpleNamespace(is_chat_model=False), acomplete=acomplete)
    gen = asyncio.run(li_generate_llm(llm)(LIQuery(text="q", prompt="q")))
    assert (gen.input_tokens, gen.output_tokens) == (1210, 5)
    assert (gen.cache_read_tokens, gen.cache_write_tokens) == (1000, 200)


# ----------------------------------------------------------------------------------------------
# 3. tables: only real-number columns are read as floats
# ----------------------------------------------------------------------------------------------
class _Kind:
    def __init__(self, kind: str) -> None:
        self.kind = kind


class _FakeFrame:
    """A pandas-like DataFrame: ``dtypes`` per column, ``to_numpy`` casting as pandas does
    (dates to nanoseconds, complex to real parts), ``__array__`` the numpy array it is."""

    def __init__(self, values: np.ndarray, kinds: list[str]) -> None:
        self.values, self.dtypes, self.shape = values, [_Kind(k) for k in kinds], values.shape

    def to_numpy(self, dtype: Any = None, na_value: Any = None) -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.values.astype(np.float64 if dtype is None else dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.values if dtype is None else self.values.astype(dtype)


_DATES = np.array([["2020-01-01", "2020-01-02"], ["2020-01-03", "2020-01-04"]],
                  dtype="datetime64[ns]")
_COMPLEX = np.array([[1 + 2j, 2 + 0j], [3 + 0j, 4 + 1j]])


@pytest.mark.parametrize("values, kind", [(_DATES, "M"), (_COMPLEX, "c")])
def test_date_or_complex_table_refused_like_its_numpy_array(values: np.ndarray, kind: str) -> None:
    frame = _FakeFrame(values, [kind, kind])
    assert table_values(frame) is None
    with pytest.raises(ConfigError) as want:
        reward_matrix(values)
    with pytest.raises(ConfigError) as got:
        reward_matrix(frame)
    assert str(got.value) == str(want.value)
    assert str(values.dtype) in str(got.value)


def test_real_dtype_table_still_read() -> None:
    frame = _FakeFrame(np.array([[0.1, 1.0], [2.0, 3.0]]), ["f", "i"])
    np.testing.assert_array_equal(reward_matrix(frame), [[0.1, 1.0], [2.0, 3.0]])


def test_real_pandas_date_and_complex_columns() -> None:
    pd = pytest.importorskip("pandas")
    dates = pd.DataFrame({"a": pd.to_datetime(["2020-01-01", "2020-01-02"]),
                          "b": pd.to_datetime(["2020-01-03", "2020-01-04"])})
    with pytest.raises(ConfigError, match="datetime64"):
        reward_matrix(dates)
    with pytest.raises(ConfigError, match="complex"):
        reward_matrix(pd.DataFrame([[1 + 2j, 2], [3, 4 + 1j]]))
    mixed = pd.DataFrame({"a": pd.to_datetime(["2020-01-01", "2020-01-02"]), "b": [1.0, 2.0]})
    with pytest.raises(ConfigError, match="rewards"):
        reward_matrix(mixed)
    nullable = pd.DataFrame([[0.1, None], [0.3, 0.4]], dtype="Float64")
    np.testing.assert_array_equal(reward_matrix(nullable), [[0.1, np.nan], [0.3, 0.4]])
    np.testing.assert_array_equal(as_reward_array(pd.Series([1, None], dtype="Int64")),
                                  [1.0, np.nan])


# ----------------------------------------------------------------------------------------------
# 4. pd.NA inside per-prompt lists is missing
# ----------------------------------------------------------------------------------------------
class NAType:
    """Stands in for pandas' ``NAType`` (CI has no pandas)."""


NAType.__module__ = "pandas._libs.missing"
_NA = NAType()


def test_na_in_per_prompt_lists_is_missing() -> None:
    x = reward_matrix([[0.1, _NA, 0.5], [0.3, 0.4]])
    np.testing.assert_array_equal(x, [[0.1, np.nan, 0.5], [0.3, 0.4, np.nan]])
    # in a record, pd.NA is read as null is (JSON's missing value)
    logged = logged_from_records(
        [{"id": "a", "rewards": [0.1, _NA, 0.2, 0.7], "correct": [True, False, _NA, True]}])
    nulls = logged_from_records(
        [{"id": "a", "rewards": [0.1, None, 0.2, 0.7], "correct": [True, False, None, True]}])
    np.testing.assert_array_equal(logged.rewards, nulls.rewards)
    assert logged.correct is not None and nulls.correct is not None
    np.testing.assert_array_equal(logged.correct, nulls.correct)


def test_other_objects_in_lists_still_refused() -> None:
    class Other:
        pass

    with pytest.raises(ConfigError, match=r"rewards\[0\]"):
        reward_matrix([[0.1, Other()], [0.3, 0.4]])


def test_real_pandas_groupby_lists_with_na() -> None:
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"prompt": ["a", "a", "b", "b", "b"],
                       "reward": pd.array([0.1, None, 0.3, 0.2, 0.6], dtype="Float64")})
    per_prompt = df.groupby("prompt")["reward"].agg(list)
    np.testing.assert_array_equal(reward_matrix(per_prompt),
                                  [[0.1, np.nan, np.nan], [0.3, 0.2, 0.6]])
    obj = pd.DataFrame([[0.1, pd.NA], [0.3, 0.4]])  # object columns
    np.testing.assert_array_equal(reward_matrix(obj), [[0.1, np.nan], [0.3, 0.4]])
    rec = logged_from_records([{"id": 1, "rewards": pd.Series([0.1, pd.NA, 0.2])}])
    null = logged_from_records([{"id": 1, "rewards": [0.1, None, 0.2]}])
    np.testing.assert_array_equal(rec.rewards, null.rewards)


# ----------------------------------------------------------------------------------------------
# 5. no refit when alpha0 sits at its fixed bound
# ----------------------------------------------------------------------------------------------
def test_no_refit_at_alpha0_fixed_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = fitting._max_evidence

    def spy(z: Any, first: Any, bounds: Any) -> Any:
        calls.append(bounds)
        return real(z, first, bounds)

    monkeypatch.setattr(fitting, "_max_evidence", spy)
    # homogeneous prompts: alpha0 runs to its bound 100, while the log's cap is also 100
    x = np.random.default_rng(1).normal(size=(2000, 4))
    fit = fit_reward_model(x, "normal")
    assert fit.prior.alpha0 == fitting.ALPHA0_BOUNDS[1]
    assert "capped" not in fit.fitted_on
    assert len(calls) == 1


def test_refit_still_runs_where_a_cap_binds(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = fitting._max_evidence

    def spy(z: Any, first: Any, bounds: Any) -> Any:
        calls.append(bounds)
        return real(z, first, bounds)

    monkeypatch.setattr(fitting, "_max_evidence", spy)
    fit = fit_reward_model([[0.3, -0.4], [1.1, 0.2]])
    assert len(calls) == 2 and fit.fitted_on["capped"] == {"nu0": 4.0, "alpha0": 1.0}


# ----------------------------------------------------------------------------------------------
# 8. fit_prior warns the fit's note (fit_reward_model records it and stays quiet)
# ----------------------------------------------------------------------------------------------
def test_fit_prior_warns_the_small_log_note() -> None:
    with pytest.warns(UserWarning, match="capped at nu0 <= 4") as rec:
        prior = fit_prior([[0.3, -0.4], [1.1, 0.2]])
    assert prior.to_dict()["nu0"] == 4.0
    note = fit_reward_model([[0.3, -0.4], [1.1, 0.2]]).fitted_on["note"]
    assert [str(w.message) for w in rec] == [note]
    assert type(rec[0].message).__name__ == "FitNoteWarning"


def test_fit_prior_quiet_without_note_and_fit_reward_model_quiet() -> None:
    x = np.random.default_rng(0).normal(size=(60, 6)) + np.random.default_rng(1).normal(
        size=(60, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_prior(x)
        fit_reward_model([[0.3, -0.4], [1.1, 0.2]])
