"""The stat plugin's request lines join the gateway's traces whatever vLLM wraps the gateway's request id in
(serving/vllm_plugin/maestro_vllm_stats: plain Python, importable without vLLM)."""

from __future__ import annotations

import pytest

from serving.vllm_plugin.maestro_vllm_stats import gateway_request_id

GATEWAY_ID = "wf-7::plan-2#1"  # attempt.upstream_headers: <workflow>::<stage>#<attempt>


@pytest.mark.parametrize(
    "vllm_id",
    [
        GATEWAY_ID,  # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION, or an engine before 0.11
        f"chatcmpl-{GATEWAY_ID}",  # the OpenAI server's prefix
        f"cmpl-{GATEWAY_ID}",
        f"chatcmpl-{GATEWAY_ID}-0a1b2c3d",  # vLLM >= 0.11: `-` and 8 random hex digits
        f"{GATEWAY_ID}-12345678",  # a suffix of digits only
    ],
)
def test_the_gateway_id_is_found_inside_vllms_request_id(vllm_id):
    assert gateway_request_id(vllm_id) == GATEWAY_ID


def test_ids_that_look_like_a_suffix_or_a_prefix_stay_part_of_the_stage():
    assert gateway_request_id("chatcmpl-wf::retry-0a1b2c3d#2-deadbeef") == "wf::retry-0a1b2c3d#2"
    assert gateway_request_id("chatcmpl-cmpl-x::s#3") == "cmpl-x::s#3"
    assert gateway_request_id("wf::s#12") == "wf::s#12"


@pytest.mark.parametrize("vllm_id", [None, "", "chatcmpl-3f2a9c", "chatcmpl-wf::s-0a1b2c3d", "wf::s#1-0a1b2c3"])
def test_a_request_that_did_not_come_through_the_gateway_joins_nothing(vllm_id):
    assert gateway_request_id(vllm_id) is None
