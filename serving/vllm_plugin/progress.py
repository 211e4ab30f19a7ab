"""A running request's output length re-predicted inside the engine from what it has produced (`maestro.progressive`).

The plugin reads the same `length_bounds` the simulator's and the gateway's batch-cost gate read, through the
hints' `output_bounds`, `footprint_tokens` and `remaining_tokens`, with the predictor's table where the plugin is
given one (`maestro_scheduler.progressive`: a predictor directory or its progressive.json), else parametric.

The class of a request's first output tokens: vLLM's engine core has output token ids, not text (detokenizing is the
API server's). Where the engine has a tokenizer (the model's, unless `--skip-tokenizer-init`), the plugin decodes a
request's first tokens with it, at most `PREFIX_TOKENS`, once each time its count reaches a power of two (4, 8, 16,
32: a handful of short decodes a request), and reads their class with `prefix_class`, as training and the simulator
read a trace's text; without a tokenizer the class is `unknown` and the table answers from the prediction and the
count alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from maestro.progressive import PREFIX_TOKENS, UNKNOWN, ProgressiveTable, load_table, prefix_class
from serving.vllm_plugin.hints import MaestroHints, footprint_tokens, remaining_tokens


def tokenizer_decode(model_config) -> Callable[[Sequence[int]], str] | None:
    """The engine's tokenizer as ids → text (special tokens kept: tool-call markup may be one), or None."""
    from vllm.tokenizers.registry import cached_tokenizer_from_config

    tokenizer = cached_tokenizer_from_config(model_config)
    if tokenizer is None:
        return None
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def tokens_to_read(num_output_tokens: int) -> int:
    """How many of a request's first output tokens its class is read from: the largest power of two not above its
    count, at most PREFIX_TOKENS (0 before its first token)."""
    if num_output_tokens <= 0:
        return 0
    return min(1 << (num_output_tokens.bit_length() - 1), PREFIX_TOKENS)


class OutputProgress:
    """The plugin's re-prediction of running requests: the table, the decoder and each request's prefix class."""

    def __init__(self, table: ProgressiveTable | None = None, decode: Callable[[Sequence[int]], str] | None = None):
        self.table, self.decode = table, decode
        self.prefixes: dict[str, tuple[int, str]] = {}  # request id → (tokens read, their class)

    @classmethod
    def of(cls, location: str | None, model_config) -> OutputProgress:
        """From `maestro_scheduler.progressive` (None: parametric) and the engine's model config."""
        table = load_table(location) if location else None
        if location and table is None:
            raise ValueError(
                f"maestro_scheduler.progressive: no progressive table at {location} (a predictor "
                "directory saved with one, or its progressive.json)"
            )
        return cls(table, tokenizer_decode(model_config) if table is not None else None)

    def prefix(self, request_id: str, output_token_ids: Sequence[int]) -> str:
        """The class of the request's first output tokens (unknown without a table or a tokenizer)."""
        if self.table is None or self.decode is None:
            return UNKNOWN
        count = tokens_to_read(len(output_token_ids))
        known = self.prefixes.get(request_id)
        if known is None or known[0] != count:
            known = self.prefixes[request_id] = count, prefix_class(self.decode(output_token_ids[:count]))
        return known[1]

    def remaining_tokens(self, request, hints: MaestroHints) -> int:
        """Predicted output tokens still to come for a running vLLM `Request`."""
        prefix = self.prefix(request.request_id, request.output_token_ids)
        return remaining_tokens(request.num_output_tokens, hints, self.table, prefix)

    def footprint_tokens(self, request, hints: MaestroHints) -> int:
        """Tokens of KV the request is predicted to hold when it ends (`hints.footprint_tokens`)."""
        prefix = self.prefix(request.request_id, request.output_token_ids)
        return footprint_tokens(
            request.num_prompt_tokens, request.num_output_tokens, request.max_tokens, hints, self.table, prefix
        )

    def forget(self, request_id: str) -> None:
        self.prefixes.pop(request_id, None)
