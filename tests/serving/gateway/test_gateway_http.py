"""The gateway's HTTP surface under bad input: field validation (400 naming the field), body size (413), API keys
(401, per-key idempotency and traces), every stage traced; and a property test fuzzing the body and headers."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from maestro.keys import key_id
from serving.gateway.app import create_app
from serving.gateway.config import GatewayConfig
from serving.gateway.core import Gateway

from .conftest import fake_nodes, run_app

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
KEY_A, KEY_B = "a" * 24, "b" * 24


def traces(directory) -> list[dict]:
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


BAD_BODIES = [  # (path, body, param, words the message must hold)
    (CHAT, {"messages": USER, "max_tokens": "abc"}, "max_tokens", "integer"),
    (CHAT, {"messages": USER, "max_tokens": -5}, "max_tokens", "positive"),
    (CHAT, {"messages": USER, "max_tokens": True}, "max_tokens", "integer"),
    (CHAT, {"messages": USER, "max_completion_tokens": 2.5}, "max_completion_tokens", "integer"),
    (CHAT, {"messages": USER, "n": 0}, "n", "positive"),
    (CHAT, {"messages": "notalist"}, "messages", "list"),
    (CHAT, {"messages": []}, "messages", "non-empty"),
    (CHAT, {"messages": [{"content": "hi"}]}, "messages[0].role", "required"),
    (CHAT, {"messages": [{"role": 1, "content": "hi"}]}, "messages[0].role", "string"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or a list"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages[0].content[0].text",
        "string",
    ),
    (CHAT, {"prompt": "hi"}, "messages", "required"),
    (CHAT, {"messages": USER, "stream": "yes"}, "stream", "true or false"),
    (CHAT, {"messages": USER, "stream_options": [1]}, "stream_options", "object"),
    (CHAT, {"messages": USER, "temperature": "hot"}, "temperature", "number"),
    (CHAT, {"messages": USER, "top_p": False}, "top_p", "number"),
    (CHAT, {"messages": USER, "tools": [{"function": "f"}]}, "tools[0].function", "object"),
    (CHAT, {"messages": USER, "metadata": "w1"}, "metadata", "object"),
    (CHAT, {"messages": USER, "metadata": {"stage_id": {"a": 1}}}, "metadata.stage_id", "string"),
    (CHAT, {"messages": USER, "metadata": {"interactive": "maybe"}}, "metadata.interactive", "true or false"),
    (CHAT, {"messages": USER, "metadata": {"workflowId": "w1"}}, "metadata.workflowId", "did you mean workflow"),
    (CHAT, {"messages": USER, "note": "\ud800"}, "note", "surrogate"),
    (COMPLETIONS, {"prompt": 5}, "prompt", "string or a list"),
    (COMPLETIONS, {"messages": USER}, "messages", "/v1/chat/completions"),
    (COMPLETIONS, {"prompt": "", "messages": None}, "messages", "not taken"),
    (COMPLETIONS, {}, "prompt", "required"),
]


@pytest.mark.parametrize("path,body,param,words", BAD_BODIES, ids=[f"{p}:{b}" for _, _, p, b in BAD_BODIES])
def test_a_malformed_field_is_400_naming_it_before_anything_is_queued(tmp_path, path, body, param, words):
    received = []

    async def calls(client, gateway):
        return await client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})

    response = asyncio.run(run_app(tmp_path, {"a": True}, calls, node_kw={"received": received}))
    error = response.json()["error"]
    assert response.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"] and error["message"].startswith(param)
    assert received == []  # vLLM never saw it


@pytest.mark.parametrize(
    "content,headers,param",
    [
        (b"{not json", {}, None),
        (b'{"messages": [{"role": "user"}], "temperature": NaN}', {}, None),
        (b"[1, 2]", {}, None),
        (b"[" * 100_000, {}, None),
        (b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}', {}, None),  # not UTF-8 (a raw surrogate)
        (json.dumps({"messages": USER}).encode(), {"X-Maestro-Interactive": "maybe"}, "X-Maestro-Interactive"),
        (json.dumps({"messages": USER}).encode(), {"X-Maestro-Stage": "s" * 300}, "X-Maestro-Stage"),
        (json.dumps({"messages": USER}).encode(), {"X-Maestro-Workflow": "w\x01"}, "X-Maestro-Workflow"),
        (json.dumps({"messages": USER}).encode(), {"X-Maestro-Parents": ",".join(["p"] * 2000)}, "X-Maestro-Parents"),
    ],
)
def test_a_body_that_is_no_json_object_or_bad_headers_are_400(tmp_path, content, headers, param):
    async def calls(client, gateway):
        return await client.post(CHAT, content=content, headers=headers), gateway.traces.num_lines

    response, num_traced = asyncio.run(run_app(tmp_path, {"a": True}, calls))
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert num_traced == 0  # no stage to name: nothing traced


def test_a_misspelt_maestro_header_is_400_naming_it_and_the_known_ones(tmp_path):
    """An OpenAI client given X-Maestro-Workflow-Id for X-Maestro-Workflow: refused, not run as a workflow of one."""
    received = []
    misspelt = {"X-Maestro-Workflow-Id": "w1", "X-Maestro-Stage-Id": "s1"}

    async def calls(client, gateway):
        refused = await client.post(CHAT, json={"messages": USER}, headers=misspelt)
        left = gateway.counters["rejected_invalid"], len(gateway.workflows), len(gateway.sessions.sessions)
        spelt = await client.post(
            CHAT, json={"messages": USER}, headers={"x-MAESTRO-workflow": "w1", "X-Maestro-Stage": "s1"}
        )
        # the router hints a gateway in front sends on (gateway/hints.py) are Maestro's own: they pass
        hinted = await client.post(CHAT, json={"messages": USER}, headers={"X-Maestro-Osl": "12"})
        return refused, left, spelt, hinted, gateway.traces.num_lines

    refused, left, spelt, hinted, num_traced = asyncio.run(
        run_app(tmp_path, {"a": True}, calls, node_kw={"received": received})
    )
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "X-Maestro-Workflow-Id"
    assert error["message"].startswith(
        "header X-Maestro-Workflow-Id: not a Maestro header (did you mean "
        "X-Maestro-Workflow?); the known ones are X-Maestro-Workflow, X-Maestro-Stage,"
    )
    assert left == (1, 0, 0)  # counted as a client error, no workflow, no session
    assert spelt.status_code == hinted.status_code == 200
    assert len(received) == num_traced == 2  # the refused call reached no node and named no stage


def test_the_openai_sdk_with_a_misspelt_maestro_header_gets_an_error_not_an_answer(tmp_path):
    """As a new user calls it: the OpenAI SDK's `extra_headers` with X-Maestro-Workflow-Id raise BadRequestError."""
    openai = pytest.importorskip("openai")

    async def calls(client, gateway):
        sdk = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="unused", http_client=client, max_retries=0)
        ask = lambda headers: sdk.chat.completions.create(model="tiny", messages=USER, extra_headers=headers)
        try:
            await ask({"X-Maestro-Workflow-Id": "w1", "X-Maestro-Stage-Id": "s1"})
        except openai.BadRequestError as error:
            refused = error
        answer = await ask({"X-Maestro-Workflow": "w1", "X-Maestro-Stage": "s1"})
        return refused, answer, list(gateway.workflows)

    refused, answer, workflows = asyncio.run(run_app(tmp_path, {"a": True}, calls))
    assert refused.status_code == 400 and refused.body["param"] == "X-Maestro-Workflow-Id"
    assert "X-Maestro-Workflow," in refused.body["message"]
    assert answer.choices and workflows == ["w1"]


def test_a_valid_body_reaches_vllm_with_its_extra_fields(tmp_path):
    received = []
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "u"}],
        "max_tokens": 3,
        "temperature": 0,
        "ignore_eos": True,
        "vendor": {"x": [1, None]},
        "n": None,
    }

    async def calls(client, gateway):
        return await client.post(CHAT, json=body)

    response = asyncio.run(run_app(tmp_path, {"a": True}, calls, node_kw={"received": received}))
    assert response.status_code == 200
    assert received[0]["ignore_eos"] is True and received[0]["vendor"] == {"x": [1, None]}


def test_a_body_over_the_limit_is_413_by_content_length_or_by_the_bytes_read(tmp_path):
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 5000}]}).encode()

    async def chunked():  # no Content-Length: the limit holds on what is read
        for i in range(0, len(big), 1000):
            yield big[i : i + 1000]

    async def calls(client, gateway):
        declared = await client.post(CHAT, content=big)
        streamed = await client.post(CHAT, content=chunked())
        small = await client.post(CHAT, json={"messages": USER, "max_tokens": 2})
        return declared, streamed, small

    declared, streamed, small = asyncio.run(run_app(tmp_path, {"a": True}, calls, server={"max_body_bytes": 4096}))
    assert declared.status_code == 413 and "4096" in declared.json()["error"]["message"]
    assert streamed.status_code == 413 and "4096" in streamed.json()["error"]["message"]
    assert small.status_code == 200


def test_api_keys_guard_every_route_but_health_and_scope_idempotency_and_traces(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text(f"# the gateway's callers\n{KEY_B}\n")
    received = []
    traced = tmp_path / "traces"

    async def calls(client, gateway):
        anonymous = [
            await client.post(CHAT, json={"messages": USER}),
            await client.post(COMPLETIONS, json={}),
            await client.get("/v1/models"),
            await client.get("/maestro/status"),
            await client.post(CHAT, json={"messages": USER}, headers={"Authorization": f"Bearer {'c' * 24}"}),
            await client.post(CHAT, json={"messages": USER}, headers={"Authorization": KEY_A}),
        ]
        health = await client.get("/health")
        stage = {"X-Maestro-Workflow": "w", "X-Maestro-Stage": "1"}
        body = {"messages": USER, "max_tokens": 2}
        a1 = await client.post(CHAT, json=body, headers={**stage, "Authorization": f"Bearer {KEY_A}"})
        b1 = await client.post(CHAT, json=body, headers={**stage, "Authorization": f"bearer {KEY_B}"})
        a2 = await client.post(CHAT, json=body, headers={**stage, "Authorization": f"Bearer {KEY_A}"})
        status = await client.get("/maestro/status", headers={"Authorization": f"Bearer {KEY_B}"})
        return anonymous, health, a1, b1, a2, status

    anonymous, health, a1, b1, a2, status = asyncio.run(
        run_app(
            traced,
            {"a": True},
            calls,
            node_kw={"received": received},
            server={"api_keys": [KEY_A], "api_keys_file": str(key_file)},
        )
    )
    assert [r.status_code for r in anonymous] == [401] * 6
    assert all(r.json()["error"]["param"] == "Authorization" for r in anonymous)
    assert all(r.headers["www-authenticate"] == "Bearer" for r in anonymous)
    assert health.status_code == 200 and status.status_code == 200
    assert a1.status_code == b1.status_code == a2.status_code == 200
    assert "x-maestro-replay" not in b1.headers  # the same workflow/stage ids under another key: its own stage
    assert a2.headers.get("x-maestro-replay") == "1"  # the same key again: the replay of its own answer
    assert len(received) == 2
    lines = traces(traced)
    assert sorted(line["caller_id"] for line in lines) == sorted([key_id(KEY_A), key_id(KEY_B)])
    text = "".join(p.read_text() for p in traced.glob("*.jsonl"))
    assert KEY_A not in text and KEY_B not in text


def test_stage_ids_with_separators_are_distinct_stages(tmp_path):
    """Idempotency keys keep workflow and stage apart: ("a::b", "c") and ("a", "b::c") are two stages."""
    received = []

    async def calls(client, gateway):
        body = {"messages": USER, "max_tokens": 2}
        first = await client.post(CHAT, json=body, headers={"X-Maestro-Workflow": "a::b", "X-Maestro-Stage": "c"})
        second = await client.post(CHAT, json=body, headers={"X-Maestro-Workflow": "a", "X-Maestro-Stage": "b::c"})
        again = await client.post(CHAT, json=body, headers={"X-Maestro-Workflow": "a", "X-Maestro-Stage": "b::c"})
        return first, second, again

    first, second, again = asyncio.run(run_app(tmp_path, {"a": True}, calls, node_kw={"received": received}))
    assert first.status_code == second.status_code == again.status_code == 200
    assert "x-maestro-replay" not in second.headers
    assert again.headers.get("x-maestro-replay") == "1"
    assert len(received) == 2


def test_without_keys_calls_are_open_and_traces_carry_no_caller(tmp_path):
    async def calls(client, gateway):
        return await client.post(CHAT, json={"messages": USER, "max_tokens": 2})

    assert asyncio.run(run_app(tmp_path, {"a": True}, calls)).status_code == 200
    assert [("caller_id" in line, line["outcome"]) for line in traces(tmp_path)] == [(False, "completed")]


def test_api_key_config_errors_say_what_to_do(tmp_path):
    nodes = [{"name": "a", "url": "http://a"}]
    with pytest.raises(ValueError, match="at least 16 characters"):
        GatewayConfig(nodes=nodes, server={"api_keys": ["short"]})
    with pytest.raises(ValueError, match="does not exist"):
        GatewayConfig(nodes=nodes, server={"api_keys_file": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="max_body_bytes"):
        GatewayConfig(nodes=nodes, server={"max_body_bytes": 10})
    assert GatewayConfig(nodes=nodes).server.host == "127.0.0.1"


def test_every_stage_ends_traced_completed_refused_or_failed(tmp_path):
    batch = {"X-Maestro-Interactive": "false"}

    async def calls(client, gateway):
        invalid = await client.post(
            CHAT,
            json={"messages": USER, "max_tokens": -1},
            headers={**batch, "X-Maestro-Workflow": "bad", "X-Maestro-Stage": "s"},
        )
        first = asyncio.ensure_future(
            client.post(CHAT, json={"messages": USER, "max_tokens": 40}, headers={**batch, "X-Maestro-Workflow": "w1"})
        )
        await asyncio.sleep(0.05)  # w1 runs and holds the node's one place
        second = asyncio.ensure_future(
            client.post(CHAT, json={"messages": USER, "max_tokens": 2}, headers={**batch, "X-Maestro-Workflow": "w2"})
        )
        await asyncio.sleep(0.05)  # w2 waits in the queue, which is now full
        full = await client.post(
            CHAT, json={"messages": USER, "max_tokens": 2}, headers={**batch, "X-Maestro-Workflow": "w3"}
        )
        return invalid, full, await first, await second

    invalid, full, first, second = asyncio.run(
        run_app(
            tmp_path,
            {"a": True},
            calls,
            node_kw={"tail_delay_s": 0.3},
            limits={"max_queued": 1, "max_inflight_per_node": 1},
        )
    )
    assert (invalid.status_code, full.status_code, first.status_code, second.status_code) == (400, 429, 200, 200)
    lines = {line["workflow_id"]: line for line in traces(tmp_path)}
    assert {w: line["outcome"] for w, line in lines.items()} == {
        "bad": "refused",
        "w3": "refused",
        "w1": "completed",
        "w2": "completed",
    }
    assert "max_tokens" in lines["bad"]["error"] and lines["bad"]["stage_id"] == "s"
    assert "queue full" in lines["w3"]["error"]

    async def dead(client, gateway):
        return await client.post(CHAT, json={"messages": USER}, headers={"X-Maestro-Workflow": "nowhere"})

    assert asyncio.run(run_app(tmp_path / "dead", {"a": False}, dead)).status_code == 503
    [line] = traces(tmp_path / "dead")
    assert line["outcome"] == "refused" and "no healthy vLLM node" in line["error"]


# ---- property test: no body or header makes a 5xx, every 4xx names a field --------------------------------------
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "tools",
    "metadata",
    "stream_interval",
    "user",
    "logprobs",
]
text = st.text(st.characters(exclude_categories=()), max_size=12)  # surrogates included
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
any_value = st.one_of(  # each kind of JSON value equally often (json_values draws mostly small leaves)
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    text.filter(bool),
    st.lists(json_values, min_size=1, max_size=3),
    st.dictionaries(text, json_values, min_size=1, max_size=3),
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool"])},
        optional={
            "content": st.none()
            | text
            | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2),
            "tool_calls": json_values,
            "name": text,
        },
    ),
    min_size=1,
    max_size=3,
)
ids = st.sampled_from(["w", "1", "a,b"]) | st.integers(0, 9) | text
metadata = st.fixed_dictionaries(
    {},
    optional={k: ids for k in ("workflow_id", "stage_id", "role", "app", "parents")}
    | {"interactive": st.booleans() | st.sampled_from(["true", "no"])},
)
VALID = {
    "model": text,
    "max_tokens": st.integers(1, 64),
    "n": st.integers(1, 2),
    "stream": st.booleans(),
    "temperature": st.floats(0, 2),
    "stop": text | st.lists(text, max_size=2),
    "seed": st.integers(),
    "metadata": metadata,
    "tools": st.lists(
        st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": text})}),
        max_size=2,
    ),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "logprobs": json_values,
}


header_text = st.text(st.characters(min_codepoint=0, max_codepoint=127, exclude_characters="\r\n"), max_size=300)
IDS = ["w", "1", "2", "a,b"]
HEADERS = {f"X-Maestro-{name}": IDS for name in ("Workflow", "Stage", "Role", "App", "Parents")} | {
    "X-Maestro-Interactive": ["true", "false", "0", "On"]
}


@st.composite
def calls(draw, field: str | None) -> tuple[str, dict, dict]:
    """An endpoint, a body and headers: a valid body with `field` broken (any JSON value) and unknown fields added,
    under valid headers; with no field, a valid body under headers of any text."""
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    body = draw(
        st.fixed_dictionaries(
            {"messages": messages} if path == CHAT else {"prompt": text | st.lists(text)}, optional=VALID
        )
    )
    if field is None:
        return path, body, draw(st.fixed_dictionaries({}, optional={h: header_text for h in [*HEADERS, "X-Other"]}))
    extra = draw(
        st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in FIELDS), json_values, max_size=2)
    )
    headers = draw(st.fixed_dictionaries({}, optional={h: st.sampled_from(v) for h, v in HEADERS.items()}))
    headers["X-Maestro-Workflow"] = draw(st.uuids()).hex  # a new stage each time: no replay of an earlier answer
    return path, {**extra, **body, field: draw(any_value)}, headers


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory):
    """The app over one vLLM-like node, kept up across the property tests' examples, and the loop it runs on."""
    loop = asyncio.new_event_loop()
    stack = loop.run_until_complete(_fuzz_target(tmp_path_factory.mktemp("fuzz-traces")))
    try:
        yield loop, stack["client"]
    finally:
        loop.run_until_complete(stack["close"]())
        loop.close()


@pytest.mark.parametrize("field", [*FIELDS, None], ids=[*FIELDS, "headers"])
def test_no_body_or_header_makes_a_5xx_and_every_4xx_names_a_field(fuzz_target, field):
    loop, client = fuzz_target

    # derandomize: the same examples every run, so CI cannot turn red by the draw; the explicit example is one a
    # random draw once found (a body key holding a "." is named whole, not cut at its dot)
    @settings(
        max_examples=12 if field else 40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )
    @given(call=calls(field))
    @example(call=("/v1/chat/completions", {"A.": {"\ud800": None}, "messages": [{"role": "user"}]}, {}))
    def check(call):
        path, body, headers = call
        response = loop.run_until_complete(client.post(path, content=json.dumps(body).encode(), headers=headers))
        assert response.status_code < 500, response.text
        if response.status_code >= 400:
            param = response.json()["error"]["param"]
            named = {*body, *(h.lower() for h in headers), "messages", "prompt", "max_tokens"}
            assert param and (param in named or param.lower() in named or re.split(r"[.\[]", param)[0] in named), (
                response.text
            )

    check()


async def _fuzz_target(tmp_path) -> dict:
    """The app over one vLLM-like node, kept up across the property test's examples."""
    nodes = fake_nodes({"a": True})
    urls = await nodes.__aenter__()
    config = GatewayConfig(
        nodes=[{"name": "a", "url": urls["a"]}],
        traces={"dir": str(tmp_path)},
        upstream={"metrics_period_s": 60},
        model="tiny",
    )
    gateway = Gateway(config)
    await gateway.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(create_app(config, gateway)), base_url="http://gw")

    async def close():
        await client.aclose()
        await gateway.stop()
        await nodes.__aexit__(None, None, None)

    return {"client": client, "close": close}
