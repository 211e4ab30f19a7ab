"""Router hints: the stage's prediction, forwarded with its call so the routers and engines in front of the
nodes can use it.

`headers` (default): llm-d-style request headers, which any HTTP upstream ignores unless it reads them.
`nvext`: also Dynamo's `nvext.agent_hints` in the body (`osl`, `priority`). vLLM's OpenAI server ignores unknown
body fields; a strict OpenAI-compatible upstream may refuse them, hence opt-in. `off`: neither.
"""

from __future__ import annotations

from enum import Enum

from predictor_service.route_hints import osl_bucket

# What `headers` sends: predicted output tokens, their bucket, output tokens reserved, tool-call probability.
HINT_HEADERS = ("x-maestro-osl", "x-maestro-osl-bucket", "x-maestro-reserve", "x-maestro-p-tool")


class RouterHints(str, Enum):
    OFF = "off"
    HEADERS = "headers"
    NVEXT = "nvext"


def hint_headers(mode: RouterHints, tokens_pred: int, reserve_tokens: int, p_tool: float) -> dict[str, str]:
    """x-maestro-osl (predicted output tokens), -osl-bucket (short / medium / long), -reserve (output tokens
    reserved), -p-tool (tool-call probability)."""
    if mode is RouterHints.OFF:
        return {}
    return dict(zip(HINT_HEADERS, (str(tokens_pred), osl_bucket(tokens_pred), str(reserve_tokens), f"{p_tool:.3f}")))


def add_agent_hints(mode: RouterHints, body: dict, tokens_pred: int, vllm_priority: int) -> None:
    """With `nvext`, set the body's `nvext.agent_hints` (the caller's other `nvext` fields kept). Dynamo runs higher
    priorities first, vLLM lower ones: the hint is vLLM's priority negated."""
    if mode is RouterHints.NVEXT:
        nvext = body.get("nvext") if isinstance(body.get("nvext"), dict) else {}
        body["nvext"] = {**nvext, "agent_hints": {"osl": tokens_pred, "priority": -vllm_priority}}
