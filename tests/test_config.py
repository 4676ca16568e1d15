import json
import math

import pytest

import beacon
from beacon import BeaconConfig, BetaPrior, ConfigError, NIGPrior, UnknownFamilyError


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cost", 0),
        ("cost", -0.1),
        ("cost", math.nan),
        ("cost", math.inf),
        ("cost", "0.1"),
        ("horizon", 2),
        ("horizon", 3.5),
        ("batch_size", 0),
        ("robust_quantile", 0.5),
        ("robust_quantile", 0.0),
        ("max_failures", -1),
    ],
)
def test_invalid_values_raise_config_error_naming_field_and_value(
    field: str, value: object
) -> None:
    with pytest.raises(ConfigError) as exc:
        BeaconConfig(**{field: value})  # type: ignore[arg-type]
    assert exc.value.field == field
    assert repr(value) in str(exc.value)
    assert isinstance(exc.value, ValueError)


def test_unknown_family_lists_registered() -> None:
    with pytest.raises(UnknownFamilyError) as exc:
        BeaconConfig(family="gaussian")
    assert "normal" in str(exc.value) and "bernoulli" in str(exc.value)
    assert "gaussian" in str(exc.value)


def test_horizon_must_exceed_k0() -> None:
    BeaconConfig(horizon=4)  # Jeffreys: k0 = 3
    with pytest.raises(ConfigError, match="horizon"):
        BeaconConfig(horizon=3)
    BeaconConfig(horizon=2, prior=NIGPrior(mu0=0, nu0=1, alpha0=2, beta0=1))


def test_prior_family_mismatch() -> None:
    with pytest.raises(ConfigError, match="prior"):
        BeaconConfig(family="normal", prior=BetaPrior())
    with pytest.raises(ConfigError, match="prior"):
        BeaconConfig(family="bernoulli", prior=NIGPrior())


def test_frozen_and_json_round_trip() -> None:
    cfg = BeaconConfig(cost=0.05, horizon=16, prior=NIGPrior(0.5, 2.0, 3.0, 1.5), transform="logit")
    with pytest.raises(AttributeError):
        cfg.cost = 1.0  # type: ignore[misc]
    again = BeaconConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    assert cfg.resolved_prior.k0 == 0
    assert again.k0 == 1  # never fewer than one sample before answering


def test_from_dict_rejects_unknown_field() -> None:
    with pytest.raises(ConfigError, match="colour"):
        BeaconConfig.from_dict({"cost": 0.1, "colour": "red"})


@pytest.mark.parametrize(
    ("prior", "k0"),
    [
        (NIGPrior(), 3),
        (NIGPrior(0, 1, 1, 1), 0),
        (NIGPrior(0, 1, 0.25, 0), 1),
        (NIGPrior(0, 1, 2, 0), 1),
        (NIGPrior(0, 0, 1, 1), 1),
        (NIGPrior(0, 0, 1, 0), 2),
        (NIGPrior(0, 0, -0.25, 0), 2),
        (NIGPrior(0, 2, -0.5, 1), 3),
    ],
)
def test_k0_follows_the_papers_table(prior: NIGPrior, k0: int) -> None:
    assert prior.k0 == k0
    assert BeaconConfig(prior=prior).k0 == max(1, k0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"nu0": -1}, "prior.nu0"),
        ({"alpha0": -1}, "prior.alpha0"),
        ({"beta0": -0.5}, "prior.beta0"),
        ({"mu0": math.nan}, "prior.mu0"),
    ],
)
def test_invalid_nig_prior(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        NIGPrior(**kwargs)
    assert exc.value.field == field


def test_invalid_beta_prior() -> None:
    with pytest.raises(ConfigError, match=r"prior\.a0"):
        BetaPrior(a0=0)


def test_bernoulli_rejects_transform_and_large_cost() -> None:
    with pytest.raises(ConfigError, match="transform"):
        BeaconConfig(family="bernoulli", transform="logit")
    with pytest.raises(ConfigError, match="cost"):
        BeaconConfig(family="bernoulli", cost=1.0)


def test_prior_round_trip_through_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = NIGPrior(0.2, 3.0, 2.5, 0.7)
    f = tmp_path / "prior.json"
    f.write_text(json.dumps({"prior": p.to_dict(), "transform": None}))
    assert beacon.load_prior(f) == p
    with pytest.raises(ConfigError, match="not found"):
        beacon.load_prior(tmp_path / "missing.json")


def test_normal_family_rejects_what_its_tables_cannot_cover_at_construction() -> None:
    with pytest.raises(ConfigError) as exc:
        BeaconConfig(prior=NIGPrior(0.0, 1.0, 1e5, 1.0))
    assert exc.value.field == "prior.alpha0"
    with pytest.raises(ConfigError) as exc:
        BeaconConfig(horizon=5000)
    assert exc.value.field == "horizon"
    BeaconConfig(horizon=5000, family="bernoulli")  # no table: any horizon


def test_numpy_scalars_are_numbers_and_are_stored_as_python_numbers() -> None:
    """Values from numpy sweeps (np.float32 cost, np.int64 horizon) are accepted everywhere."""
    import json

    import numpy as np

    from beacon import Budget, LogitTransform, RetryPolicy, reservation_cost

    cfg = BeaconConfig(cost=np.float32(0.25), horizon=np.int64(8), batch_size=np.int32(2),
                       robust_quantile=np.float64(0.05))
    assert cfg == BeaconConfig(cost=0.25, horizon=8, batch_size=2, robust_quantile=0.05)
    assert type(cfg.horizon) is int and type(cfg.cost) is float
    assert json.loads(json.dumps(cfg.to_dict()))["horizon"] == 8
    budget = Budget(max_tokens=np.int64(100), max_cost=np.float32(0.5))
    assert json.loads(json.dumps(budget.to_dict())) == {
        "max_tokens": 100, "max_cost": 0.5, "max_seconds": None,
        "price_per_input_token": 0.0, "price_per_output_token": 0.0,
    }
    retry = RetryPolicy(max_attempts=np.int64(4), base_delay=np.float32(0.5))
    assert type(retry.max_attempts) is int and retry.base_delay == 0.5
    assert reservation_cost(np.int64(8), np.int64(3), 1.0, 1.0) == reservation_cost(8, 3, 1.0, 1.0)
    assert LogitTransform(eps=np.float32(0.25)).eps == 0.25
    # numpy booleans and floats for integer fields are still rejected, naming the field
    for kw, field in (({"horizon": np.True_}, "horizon"), ({"horizon": np.float64(8.0)}, "horizon"),
                      ({"cost": np.True_}, "cost")):
        with pytest.raises(ConfigError) as ei:
            BeaconConfig(**kw)
        assert ei.value.field == field
    with pytest.raises(ConfigError, match="max_tokens"):
        Budget(max_tokens=np.float64(5.0))


@pytest.mark.parametrize("cost", [10**400, -(10**400)])
def test_an_int_cost_beyond_the_float_range_is_a_config_error(cost: int) -> None:
    # float(10**400) raises OverflowError: it must be the typed error naming the field
    with pytest.raises(ConfigError) as exc:
        BeaconConfig(cost=cost)
    assert exc.value.field == "cost" and exc.value.value == cost


def test_numpy_boolean_robust_is_accepted_and_stored_as_bool() -> None:
    import numpy as np

    for flag in (np.True_, np.False_):
        cfg = BeaconConfig(robust=flag)  # type: ignore[arg-type]
        assert type(cfg.robust) is bool and cfg.robust is bool(flag)
        assert cfg == BeaconConfig(robust=bool(flag))
    with pytest.raises(ConfigError, match="robust"):
        BeaconConfig(robust=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["costt", "_k0", "_prior"])
def test_replace_with_an_unknown_field_is_a_typed_error_naming_it(field: str) -> None:
    from beacon import ConfigTypeError

    with pytest.raises(ConfigTypeError) as exc:
        BeaconConfig().replace(**{field: 1})
    assert exc.value.field == field and isinstance(exc.value, TypeError)
    assert BeaconConfig().replace(cost=0.5).cost == 0.5


def test_a_pydantic_model_holds_a_config_validated_dumped_and_described_by_its_dict() -> None:
    # A BeaconConfig field in a pydantic model (a FastAPI request body, a LangChain runnable's
    # configurable field) had no schema: the model could not even be built, and a config
    # default in a JSON schema carried the private derived attributes.
    import dataclasses

    import pydantic

    class Request(pydantic.BaseModel):
        prompt: str
        config: BeaconConfig = BeaconConfig(cost=0.3, horizon=8)

    cfg = BeaconConfig(cost=0.5, horizon=12, transform="logit",
                       prior=NIGPrior(mu0=0.0, nu0=1.0, alpha0=2.0, beta0=1.0))
    req = Request.model_validate_json(json.dumps({"prompt": "q", "config": cfg.to_dict()}))
    assert req.config == cfg and isinstance(req.config, BeaconConfig)
    assert Request(prompt="q", config=cfg).config is cfg
    assert json.loads(req.model_dump_json())["config"] == cfg.to_dict()
    assert Request.model_validate_json(req.model_dump_json()) == req

    with pytest.raises(pydantic.ValidationError, match=r"cost=-1"):
        Request.model_validate({"prompt": "q", "config": {"cost": -1}})
    with pytest.raises(pydantic.ValidationError, match=r"horizonn"):
        Request.model_validate({"prompt": "q", "config": {"horizonn": 8}})
    with pytest.raises(pydantic.ValidationError, match=r"config=3"):
        Request.model_validate({"prompt": "q", "config": 3})

    schema = Request.model_json_schema()["properties"]["config"]
    init_fields = [f.name for f in dataclasses.fields(BeaconConfig) if f.init]
    assert sorted(schema["properties"]) == sorted(init_fields)
    assert schema["additionalProperties"] is False
    assert schema["default"] == BeaconConfig(cost=0.3, horizon=8).to_dict()
    for name, prop in schema["properties"].items():
        assert prop["default"] == getattr(BeaconConfig(), name) or name in ("prior", "transform")
    assert dataclasses.asdict(cfg).keys() == set(init_fields)
