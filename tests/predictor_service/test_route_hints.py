"""/route_hints: the service's predictions as an external endpoint picker reads them."""

import pytest

from predictor_service.client import to_wire as unlabelled
from predictor_service.route_hints import MEDIUM_MAX_TOKENS, SHORT_MAX_TOKENS, osl_bucket


@pytest.mark.parametrize(
    "tokens, bucket",
    [
        (0, "short"),
        (SHORT_MAX_TOKENS, "short"),
        (SHORT_MAX_TOKENS + 1, "medium"),
        (MEDIUM_MAX_TOKENS, "medium"),
        (MEDIUM_MAX_TOKENS + 1, "long"),
    ],
)
def test_bucket_bounds(tokens, bucket):
    assert osl_bucket(tokens) == bucket


def test_route_hints_are_the_predictions_with_their_bucket(api, sample_records):
    stages = [unlabelled(r) for r in sample_records[:12]]
    predictions = api.post("/predict_unbatched", json={"stages": stages}).json()
    response = api.post("/route_hints", json={"stages": stages})
    assert response.status_code == 200, response.text
    hints = response.json()
    assert [(h["workflow_id"], h["stage_id"]) for h in hints] == [(s["workflow_id"], s["stage_id"]) for s in stages]
    for hint, prediction in zip(hints, predictions):
        assert (hint["osl"], hint["reserve"], hint["p_tool"]) == (
            prediction["tokens_pred"],
            prediction["tokens_reserve"],
            prediction["p_tool"],
        )
        assert hint["bucket"] == osl_bucket(hint["osl"]) and hint["reserve"] >= hint["osl"]
    assert len({h["bucket"] for h in hints}) >= 2, "the sample should span more than one bucket"


def test_route_hints_refuses_stages_with_labels(api, sample_records):
    response = api.post("/route_hints", json={"stages": [sample_records[0]]})
    assert response.status_code == 400 and "output_tokens" in response.text
