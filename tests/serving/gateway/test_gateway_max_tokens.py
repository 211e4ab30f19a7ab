"""A chat call without max_tokens: the gateway sizes its KV reserve to a cap and sends vLLM that cap, never more
than the node's context (`max_model_len` from /v1/models) leaves after the prompt's estimate."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from maestro.contract import prompt_text
from pipelines.collect import collect
from pipelines.synth import generate
from serving.gateway.config import GatewayConfig, KVConfig
from serving.gateway.core import Gateway
from serving.gateway.prompt_tokens import PromptSizer

from .conftest import run_app

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
HEADERS = {"X-Maestro-Workflow": "w", "X-Maestro-Role": "planner"}


def test_the_cap_is_the_default_less_what_the_smallest_context_leaves():
    gateway = Gateway(
        GatewayConfig(
            nodes=[{"name": "a", "url": "http://a"}, {"name": "b", "url": "http://b"}], kv={"default_max_tokens": 512}
        )
    )
    assert gateway.output_cap(100) == 512  # no node has listed its context yet
    gateway.nodes[0].vllm.max_model_len, gateway.nodes[1].vllm.max_model_len = 4096, 2048
    assert (gateway.output_cap(100), gateway.output_cap(1800), gateway.output_cap(3000)) == (512, 248, 1)


def test_a_chat_call_without_max_tokens_is_sent_with_its_cap_and_a_completion_call_as_it_came(tmp_path):
    received = []

    async def calls(client, gateway):
        chat = await client.post(
            CHAT, json={"messages": [{"role": "user", "content": "hi"}]}, headers={**HEADERS, "X-Maestro-Stage": "chat"}
        )
        asked = await client.post(
            CHAT,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7},
            headers={**HEADERS, "X-Maestro-Stage": "asked"},
        )
        completion = await client.post(COMPLETIONS, json={"prompt": "hi"}, headers={**HEADERS, "X-Maestro-Stage": "c"})
        return chat, asked, completion

    responses = asyncio.run(
        run_app(tmp_path, {"a": True}, calls, node_kw={"received": received}, kv={"default_max_tokens": 40})
    )
    assert [r.status_code for r in responses] == [200] * 3
    assert received[0]["max_tokens"] == 40 and received[1]["max_tokens"] == 7 and "max_tokens" not in received[2]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_on_vllm_a_call_without_max_tokens_gets_its_cap_or_the_room_its_prompt_leaves(vllm_engine, tmp_path):
    """The session engine's max_model_len is 2048. A short prompt is sent with the default cap; a prompt the
    gateway estimates at 2048 − 30 tokens (catalog text, ~3.2 characters a token, estimated at 3) with what is
    left: vLLM generates no more than the stage's KV reserve was sized to."""
    from .test_gateway_vllm import gateway_for

    catalog_text = " ".join(prompt_text(r["prompt"]) for r in generate(60, seed=3))
    long_prompt = [{"role": "user", "content": catalog_text[: 3 * (2048 - 30 - PromptSizer.template_tokens(1))]}]
    room = 2048 - PromptSizer(KVConfig().chars_per_token).estimate(len(prompt_text(long_prompt)), 1)
    with gateway_for([vllm_engine], tmp_path, kv={"default_max_tokens": 64}) as gw:
        node = until_listed(gw.url)
        answers = {
            stage: httpx.post(
                f"{gw.url}{CHAT}",
                timeout=120,
                headers={**HEADERS, "X-Maestro-Stage": stage},
                json={"messages": messages, "ignore_eos": True},
            )
            for stage, messages in (
                ("short", [{"role": "user", "content": "Plan a trip to Oslo."}]),
                ("long", long_prompt),
            )
        }
    assert node["max_model_len"] == 2048 and 20 < room < 64
    assert {s: a.status_code for s, a in answers.items()} == {"short": 200, "long": 200}
    traced = {s.stage_id: s.model_extra["max_tokens"] for s in collect(tmp_path)[0]}
    short, long = (answers[s].json()["usage"] for s in ("short", "long"))
    assert short["completion_tokens"] == traced["short"] == 64
    assert long["completion_tokens"] == traced["long"] == room
    assert long["prompt_tokens"] + long["completion_tokens"] <= 2048


def until_listed(url: str, timeout_s: float = 30.0) -> dict:
    """The gateway's first node once it has read the node's /v1/models (a poll may time out on a busy box)."""
    deadline = time.monotonic() + timeout_s
    while (node := httpx.get(f"{url}/maestro/status", timeout=10).json()["nodes"][0])["max_model_len"] is None:
        assert time.monotonic() < deadline, "the gateway never read the node's max_model_len"
        time.sleep(0.2)
    return node
