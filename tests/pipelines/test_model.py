import lightgbm as lgb
import numpy as np
import pandas as pd
import pytest

from pipelines.calibration import conformal_quantile
from pipelines.metrics import expected_calibration_error
from pipelines.model import TwoStageModel
from pipelines.model_config import ModelConfig, asymmetric_l2, regression_objective


def test_asymmetric_loss_penalises_under_estimation_more():
    data = lgb.Dataset(np.zeros((4, 1)), label=np.array([5.0, 5.0, 5.0, 5.0])).construct()
    grad, hess = asymmetric_l2(3.0)(np.array([4.0, 6.0, 5.0, 3.0]), data)
    assert grad[0] == pytest.approx(-6.0) and grad[1] == pytest.approx(2.0)  # under: 3× the pull
    assert grad[2] == 0.0 and hess[0] == 6.0 and hess[1] == 2.0


def test_asymmetric_regressor_sits_above_the_plain_one():
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"x": rng.random(2000)})
    y = X["x"].to_numpy() + rng.normal(0, 0.3, 2000)
    fit = lambda w: lgb.train(
        {"verbosity": -1, "objective": asymmetric_l2(w)}, lgb.Dataset(X, y, init_score=np.full(2000, y.mean())), 100
    )
    up = fit(4.0).predict(X) + y.mean()
    even = fit(1.0).predict(X) + y.mean()
    assert np.mean(y > up) < 0.35 < np.mean(y > even)


def test_pinball_regressor_sits_at_the_weighted_quantile():
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"x": rng.random(4000)})
    y = X["x"].to_numpy() + rng.exponential(0.5, 4000)  # skewed noise: quantiles far from the mean
    fit = lambda w: lgb.train(
        {"verbosity": -1, **regression_objective("pinball", w)},
        lgb.Dataset(X, y, init_score=np.full(4000, y.mean())),
        200,
    )
    for weight, level in ((1.5, 0.6), (4.0, 0.8)):
        below = np.mean(y <= fit(weight).predict(X) + y.mean())
        assert abs(below - level) < 0.04, (weight, below)
    with pytest.raises(ValueError, match="loss"):
        ModelConfig(loss="hinge")


def test_conformal_quantile_covers_at_the_promised_rate():
    rng = np.random.default_rng(1)
    misses = []
    for _ in range(200):
        calibration, fresh = rng.normal(size=200), rng.normal(size=200)
        misses.append(np.mean(fresh > conformal_quantile(calibration, 0.1)))
    assert 0.07 < np.mean(misses) <= 0.105
    assert conformal_quantile(np.arange(5.0), 0.05) == float("inf")  # too few points to promise 95%


def synthetic_frame(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    role = rng.choice(["caller", "writer", "mixed"], n)
    items = rng.integers(1, 10, n)
    p = np.select([role == "caller", role == "writer"], [0.9, 0.05], 0.5)
    is_tool = rng.random(n) < p
    tokens = np.where(is_tool, rng.lognormal(np.log(30), 0.2, n), rng.lognormal(np.log(80 * items), 0.3, n))
    X = pd.DataFrame(
        {
            "role": pd.Categorical(role, categories=["caller", "mixed", "writer", "unknown"]),
            "items": items,
            "noise": rng.random(n),
        }
    )
    return X, tokens.astype(int), is_tool, np.arange(n) // 4


def test_two_stage_model_is_calibrated_and_keeps_the_reserve_promise():
    config = ModelConfig(
        alpha=0.1,
        classifier=dict(n_estimators=60, learning_rate=0.1),
        regressor=dict(n_estimators=150, learning_rate=0.1),
    )
    X, tokens, is_tool, groups = synthetic_frame(3000)
    model = TwoStageModel(config).fit(X, tokens, is_tool, groups)
    Xt, tt, it, _ = synthetic_frame(3000, seed=1)
    out = model.predict(Xt)
    assert expected_calibration_error(it.astype(int), out["p_tool"]) < 0.05
    assert np.mean(tt > out["tokens_reserve"]) <= 0.13
    assert np.all(out["tokens_reserve"] >= out["tokens_pred"])
    by_items = pd.Series(out["tokens_pred"]).groupby(Xt["items"].to_numpy()).median()
    assert by_items.is_monotonic_increasing or by_items.iloc[-1] > 3 * by_items.iloc[0]


def test_unfitted_model_and_bad_config_fail_clearly():
    with pytest.raises(RuntimeError, match="not fitted"):
        TwoStageModel().predict(pd.DataFrame({"x": [1]}))
    with pytest.raises(ValueError, match="alpha"):
        ModelConfig(alpha=0.7)
    with pytest.raises(ValueError, match="reserve_method"):
        ModelConfig(reserve_method="magic")


def test_bagged_regressor_averages_its_members_in_log_space():
    small = dict(
        n_estimators=40,
        learning_rate=0.1,
        num_leaves=7,
        subsample=0.8,
        subsample_freq=1,
        colsample_bytree=0.8,
        extra_trees=True,
    )
    config = ModelConfig(
        classifier=dict(n_estimators=20), quantile=dict(n_estimators=20), regressor=small, regressor_bags=3
    )
    X, tokens, is_tool, groups = synthetic_frame(800)
    model = TwoStageModel(config).fit(X, tokens, is_tool, groups)
    regressor = model.regressor_
    assert len(regressor.more) == 2  # three members: the seeds differ, so their trees do
    matrix = np.column_stack([X[["items", "noise"]].to_numpy(float), np.full(len(X), 0.5)])
    matrix = np.column_stack([X["role"].cat.codes.to_numpy(float), matrix])
    members = [b.predict(matrix) for b in (regressor.booster, *regressor.more)]
    assert not np.allclose(members[0], members[1])
    np.testing.assert_allclose(regressor.predict(matrix), np.mean(members, axis=0) + regressor.base)
    del regressor.more  # a regressor pickled before bagging existed: its one booster answers
    np.testing.assert_allclose(regressor.predict(matrix), members[0] + regressor.base)
    with pytest.raises(ValueError, match="regressor_bags"):
        ModelConfig(regressor_bags=0)


def test_reserve_tradeoff_walks_from_misses_to_waste_through_the_calibrated_point():
    from pipelines.metrics import quality
    from pipelines.plots import reserve_tradeoff

    rng = np.random.default_rng(0)
    tokens = rng.lognormal(4, 1, 500)
    reserve = tokens * rng.lognormal(0.3, 0.5, 500)
    frame = pd.DataFrame(
        {
            "tokens": tokens,
            "is_tool": rng.random(500) < 0.3,
            "p_tool": 0.3,
            "tokens_pred": tokens,
            "tokens_reserve": reserve,
        }
    )
    table = reserve_tradeoff({"model": frame, "role_p90": frame.assign(tokens_reserve=np.quantile(tokens, 0.9))})
    curve = table[table["reserve"] == "model"].sort_values("log_shift")
    at_zero = curve[curve["log_shift"] == 0].iloc[0]
    assert at_zero["above_reserve"] == pytest.approx(quality(frame)["under_rate"])
    assert at_zero["over_reservation"] == pytest.approx(quality(frame)["over_reservation"])
    assert np.all(np.diff(curve["above_reserve"]) <= 0) and np.all(np.diff(curve["over_reservation"]) >= 0)
    assert curve["above_reserve"].iloc[0] > at_zero["above_reserve"] > curve["above_reserve"].iloc[-1]
    assert len(table[table["reserve"] == "role_p90"]) == 1


def test_role_conformal_baseline_keeps_the_miss_rate_per_role_and_falls_back_for_small_roles():
    from pipelines.metrics import role_baselines

    rng = np.random.default_rng(3)

    def labels(n_big: int, n_small: int) -> pd.DataFrame:
        role = ["big"] * n_big + ["small"] * n_small
        tokens = np.concatenate([rng.lognormal(5, 1, n_big), rng.lognormal(2, 0.1, n_small)])
        return pd.DataFrame({"tokens": tokens, "is_tool": False, "role": role, "app": "a"})

    train, fresh = labels(400, 10), labels(4000, 10)
    frames = role_baselines(train, fresh, rho=0.2, alpha=0.05)
    reserve = frames["role_conformal"]["tokens_reserve"].to_numpy()
    big = fresh["role"].to_numpy() == "big"
    assert 0.02 < np.mean(fresh["tokens"].to_numpy()[big] > reserve[big]) <= 0.08
    # ten stages cannot promise 95 %: the small role gets the level of all training stages
    assert np.all(reserve[~big] == conformal_quantile(train["tokens"].to_numpy(), 0.05))
    assert set(frames) == {"global_median", "role_median", "role_p90", "role_conformal"}
    # a training set too small for any promise: the largest training output, never inf or NaN
    tiny = role_baselines(train.head(5), fresh, rho=0.2, alpha=0.05)["role_conformal"]["tokens_reserve"]
    assert np.all(tiny == train.head(5)["tokens"].max())


def test_a_classifier_without_the_embedding_reads_only_the_other_columns_on_every_path():
    X, tokens, is_tool, groups = synthetic_frame(600)
    X = X.assign(emb_0=np.random.default_rng(2).normal(size=len(X)), emb_1=0.0)
    small = dict(classifier=dict(n_estimators=20), quantile=dict(n_estimators=20), regressor=dict(n_estimators=20))
    model = TwoStageModel(ModelConfig(classifier_embedding=False, **small)).fit(X, tokens, is_tool, groups)
    assert model.classifier_.feature_name() == ["role", "items", "noise"]
    assert model.feature_names == ["role", "items", "noise", "emb_0", "emb_1"]  # the regressors still read them
    out = model.predict(X)
    matrix = np.column_stack([X["role"].cat.codes.to_numpy(float), X[["items", "noise", "emb_0", "emb_1"]].to_numpy()])
    raw = model.classifier_.predict(matrix[:, :3])
    np.testing.assert_array_equal(out["p_tool"], model.calibrator_.predict(raw))
    one = model.predict_matrix(matrix[:1], ["caller"])
    assert one["p_tool"][0] == pytest.approx(out["p_tool"][0], abs=1e-12)
    with_embedding = TwoStageModel(ModelConfig(**small)).fit(X, tokens, is_tool, groups)
    assert with_embedding.classifier_.feature_name() == model.feature_names


def test_a_model_pickled_before_the_split_of_this_module_still_loads():
    """Predictors saved before pipelines/boosters.py and pipelines/calibration.py name their classes in
    pipelines.model (the bagged regressor as _Regressor): unpickling them must find the same classes."""
    import pickle

    from pipelines.boosters import Regressor
    from pipelines.calibration import SigmoidCalibrator

    X, tokens, is_tool, groups = synthetic_frame(400)
    small = dict(classifier=dict(n_estimators=10), quantile=dict(n_estimators=10), regressor=dict(n_estimators=10))
    model = TwoStageModel(ModelConfig(**small)).fit(X, tokens, is_tool, groups)
    data = pickle.dumps(model, protocol=2)  # protocol 2 names each class as text: "module\nname\n"
    old = data.replace(b"pipelines.boosters\nRegressor\n", b"pipelines.model\n_Regressor\n").replace(
        b"pipelines.calibration\nSigmoidCalibrator\n", b"pipelines.model\nSigmoidCalibrator\n"
    )
    assert old != data and b"pipelines.boosters\nRegressor" not in old
    loaded = pickle.loads(old)
    assert isinstance(loaded.regressor_, Regressor) and isinstance(loaded.calibrator_, SigmoidCalibrator)
    for key, values in model.predict(X).items():
        np.testing.assert_array_equal(loaded.predict(X)[key], values)
