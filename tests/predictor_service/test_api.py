"""The service's HTTP API through BentoML's ASGI app (no server process)."""

import pytest

from pipelines.collect import collect
from predictor_service.client import parse_answers
from predictor_service.client import to_wire as unlabelled
from predictor_service.schemas import MAX_PROMPT_CHARS, MAX_STAGES_PER_REQUEST, PredictionOut


def first_error(response) -> dict:
    assert 400 <= response.status_code < 500, response.text
    return response.json()["detail"][0]


def test_predict_answers_every_stage_with_the_model_version(api, sample_records):
    stages = [unlabelled(r) for r in sample_records[:5]]
    response = api.post("/predict", json={"stages": stages})
    assert response.status_code == 200, response.text
    answers = [PredictionOut.model_validate(a) for a in response.json()]
    assert [(a.workflow_id, a.stage_id) for a in answers] == [(s["workflow_id"], s["stage_id"]) for s in stages]
    assert all(
        a.fallback_level == "role" and a.source == "model" and a.model_version.startswith("dir-") for a in answers
    )
    assert all(0 <= a.p_tool <= 1 and a.tokens_reserve >= a.tokens_pred >= 0 for a in answers)
    unbatched = api.post("/predict_unbatched", json={"stages": stages}).json()
    assert unbatched == response.json()


def test_predict_answers_carry_the_workflows_remaining_work(api, sample_records, model_dir):
    """Every answer carries the workflow model's fields, the same as the predictor in-process gives, and the client
    reads them into the one Prediction type; an app training never saw is answered by the position table."""
    from maestro.contract import StageTrace
    from pipelines.predictor import Predictor

    workflow = [r for r in sample_records if r["workflow_id"] == sample_records[0]["workflow_id"]]
    stages = [unlabelled(r) for r in workflow]
    response = api.post("/predict", json={"stages": stages})
    assert response.status_code == 200, response.text
    answers = [a.prediction() for a in parse_answers(response, stages)]
    offline = Predictor.load(model_dir).predict([StageTrace.model_validate(s) for s in stages])
    assert [a.remaining_fields() for a in answers] == [p.remaining_fields() for p in offline]
    assert {a.wf_fallback_level for a in answers} == {"app"}
    assert answers[0].wf_remaining_calls > answers[-1].wf_remaining_calls  # less work left further on
    assert all(a.wf_remaining_tokens_upper >= a.wf_remaining_tokens for a in answers)
    (stranger,) = api.post(
        "/predict", json={"stages": [dict(stages[0], app="an-app-nobody-trained-on", workflow_id="new-app")]}
    ).json()
    assert stranger["wf_fallback_level"] == "position"


def test_unseen_role_answers_through_the_fallback_chain(api, sample_records):
    stranger = dict(unlabelled(sample_records[0]), role="a-role-nobody-trained-on")
    (answer,) = api.post("/predict", json={"stages": [stranger]}).json()
    assert answer["fallback_level"] == "global"
    assert api.get("/stats").json()["fallback_counts"]["global"] >= 1


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda s: s.pop("role"), ["stages", 0, "role"]),
        (lambda s: s.update(prompt=42), ["stages", 0, "prompt"]),
        (lambda s: s.update(call_index=-1), ["stages", 0, "call_index"]),
    ],
)
def test_malformed_stage_gets_400_naming_the_field(api, sample_records, mutate, field):
    stage = unlabelled(sample_records[0])
    mutate(stage)
    error = first_error(api.post("/predict", json={"stages": [stage]}))
    assert error["loc"][: len(field)] == field


def test_labels_in_predict_are_refused_with_where_to_send_them(api, sample_records):
    error = first_error(api.post("/predict", json={"stages": [sample_records[0]]}))
    assert "/observe" in error["msg"] and error["loc"] == ["stages", 0]


def test_oversized_requests_are_refused_with_the_limit(api, sample_records):
    stage = unlabelled(sample_records[0])
    too_many = first_error(api.post("/predict", json={"stages": [stage] * (MAX_STAGES_PER_REQUEST + 1)}))
    assert too_many["loc"] == ["stages"] and str(MAX_STAGES_PER_REQUEST) in too_many["msg"]
    huge = dict(stage, prompt="x" * (MAX_PROMPT_CHARS + 1))
    too_long = first_error(api.post("/predict", json={"stages": [huge]}))
    assert too_long["loc"] == ["stages", 0, "prompt"] and str(MAX_PROMPT_CHARS) in too_long["msg"]


@pytest.mark.parametrize("body", [b"{not json", b"[]", b'{"stages": []}', b'{"stages": "x"}', b"\xff\xfe"])
def test_garbage_bodies_get_4xx_and_the_worker_keeps_serving(api, sample_records, body):
    response = api.post("/predict", content=body, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500
    assert api.post("/predict", json={"stages": [unlabelled(sample_records[0])]}).status_code == 200


def test_observe_updates_the_role_correction_and_writes_a_collectable_trace(api, sample_records, service_env):
    finished = [
        dict(r, workflow_id=f"observed/{r['workflow_id']}", output_tokens=r["output_tokens"] * 3 + 50)
        for r in sample_records[:40]
    ]
    num_observed_before = api.get("/stats").json()["num_observed"]  # other tests share the service
    api.post("/predict", json={"stages": [unlabelled(r) for r in finished[:20]]})  # half served, half not
    response = api.post("/observe", json={"stages": finished})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["num_accepted"] == 40
    stats = api.get("/stats").json()
    assert stats["num_observed"] == num_observed_before + 40
    roles = {r["role"] for r in finished}  # other tests (fuzzing) observe other roles on the same service
    active = {role: c for role, c in stats["corrections"].items() if c["is_active"] and role in roles}
    # every answer ran 3× longer: no factor below 1; where a role's mean stands out of its noise, above
    assert active and all(1.0 <= c["factor"] <= 2.0 for c in active.values())
    role = max(active, key=lambda r: active[r]["factor"])
    assert active[role]["factor"] > 1.0
    stage = next(unlabelled(r) for r in sample_records if r["role"] == role)
    (answer,) = api.post("/predict", json={"stages": [stage]}).json()
    assert answer["correction"] == pytest.approx(active[role]["factor"], rel=1e-3)
    # 3× longer than served: the reserves were missed, so the reserve's factor rose past the tokens'
    # the reserve is corrected per (app, role, history) group: /stats shows the role's widest
    assert 1.0 < answer["reserve_correction"] <= active[role]["reserve_factor"] * (1 + 1e-3)
    assert answer["reserve_correction"] > answer["correction"] or answer["reserve_correction"] == pytest.approx(2.0)
    stages, errors = collect(service_env / "observed")
    stages = [s for s in stages if s.workflow_id.startswith("observed/")]
    errors = [e for e in errors if "observed/" in e.reason]  # other tests (fuzzing) observe malformed workflows
    assert len(stages) == 40 and not errors
    assert all(s.is_labelled and s.model_extra.get("served_model_version") for s in stages)
    assert all(s.model_extra["served_tokens_reserve"] >= s.model_extra["served_tokens_pred"] for s in stages)


def test_observe_requires_labels(api, sample_records):
    error = first_error(api.post("/observe", json={"stages": [unlabelled(sample_records[0])]}))
    assert error["loc"][:2] == ["stages", 0]


def test_stats_and_probes(api):
    assert api.get("/livez").status_code == 200 and api.get("/readyz").status_code == 200
    stats = api.get("/stats").json()
    assert stats["model_version"].startswith("dir-")
    assert stats["limits"]["max_stages_per_request"] == MAX_STAGES_PER_REQUEST


def test_reload_swaps_the_model_and_a_bad_one_leaves_it_serving(api, admin, priors_dir, model_dir, sample_records):
    before = api.get("/stats").json()["model_version"]
    missing = api.post("/admin/reload", json={"model": str(priors_dir.parent / "nowhere")}, headers=admin)
    assert missing.status_code == 404 and "still serving" in missing.text.lower()
    assert "nowhere" not in missing.text  # the reply never echoes a path
    assert api.get("/stats").json()["model_version"] == before
    response = api.post("/admin/reload", json={"model": str(priors_dir)}, headers=admin)
    assert response.status_code == 200, response.text
    assert response.json()["previous_version"] == before
    try:
        (answer,) = api.post("/predict", json={"stages": [unlabelled(sample_records[0])]}).json()
        assert answer["fallback_level"] == "prior" and answer["model_version"] == response.json()["model_version"]
        assert answer["wf_fallback_level"] == "position"  # its workflow model: too few stages for boosters
    finally:
        reloaded = api.post("/admin/reload", json={"model": str(model_dir)}, headers=admin)
        assert reloaded.json()["model_version"] == before


def test_a_stage_predicted_after_its_parents_were_observed_sees_them(api, sample_records, model_dir):
    """/observe feeds the service's stage history: a stage sent alone is featurized with its finished
    ancestors, as it would be beside them in a trace file (here: the same p_tool as the whole workflow
    predicted in-process; the online correction scales tokens only)."""
    from maestro.contract import StageTrace
    from pipelines.features import StageHistory
    from pipelines.predictor import Predictor
    from predictor_service.schemas import ObserveRequest, PredictRequest

    workflows = {}
    for record in sample_records[200:]:
        workflows.setdefault(record["workflow_id"], []).append(
            dict(record, workflow_id=f"history/{record['workflow_id']}")
        )
    workflow = max(workflows.values(), key=len)
    assert api.post("/observe", json={"stages": workflow[:-1]}).status_code == 200
    (answer,) = api.post("/predict", json={"stages": [unlabelled(workflow[-1])]}).json()
    offline = [StageTrace.model_validate(r) for r in workflow[:-1]] + [
        StageTrace.model_validate(unlabelled(workflow[-1]))
    ]
    predictor = Predictor.load(model_dir)
    assert answer["p_tool"] == predictor.predict(offline)[-1].p_tool
    # The workflow fields from the observed ancestors too: the in-process predictor given the stage as /predict
    # parses it (its structure derived within its request) and the observed stages as history.
    history = StageHistory()
    history.add(ObserveRequest(stages=workflow[:-1]).stages)
    (parsed,) = PredictRequest(stages=[unlabelled(workflow[-1])]).stages
    (expected,) = predictor.predict([parsed], history)
    (alone,) = predictor.predict(PredictRequest(stages=[unlabelled(workflow[-1])]).stages)
    wf = {k: v for k, v in expected.to_dict().items() if k.startswith("wf_")}
    assert {k: answer[k] for k in wf} == wf and wf["wf_fallback_level"] == "app"
    assert expected.remaining_fields() != alone.remaining_fields()  # the history changed the answer
