"""Prompt tokens before vLLM has counted them: characters over a ratio learned from vLLM's own usage.

The gateway must size a stage's KV reserve before forwarding it, and tokenizing every prompt
(or a /tokenize round trip) costs more than the gateway may add. Instead it starts from a
conservative characters-per-token guess and, once vLLM has reported `prompt_tokens` for enough
calls, uses the measured ratio (totals, so long prompts weigh more) with a small safety margin.
"""

from __future__ import annotations

import math

TEMPLATE_TOKENS_PER_MESSAGE = 8  # chat template tokens around each message (role markers, separators)
TEMPLATE_TOKENS = 8  # and once per prompt (generation prompt)


class PromptSizer:
    """Estimate prompt tokens from characters; `observe` what vLLM counted to calibrate."""

    def __init__(
        self, chars_per_token: float, is_calibrated: bool = True, margin: float = 0.05, min_observations: int = 16
    ):
        self.initial_chars_per_token = chars_per_token
        self.is_calibrated, self.margin, self.min_observations = is_calibrated, margin, min_observations
        self.num_observations = 0
        self.sum_chars = 0
        self.sum_text_tokens = 0

    @property
    def chars_per_token(self) -> float:
        """The ratio in use: the initial guess until enough calls were measured, then the measured one less margin."""
        if not self.is_calibrated or self.num_observations < self.min_observations or self.sum_text_tokens <= 0:
            return self.initial_chars_per_token
        measured = self.sum_chars / self.sum_text_tokens
        return min(8.0, max(1.0, measured / (1 + self.margin)))

    @staticmethod
    def template_tokens(num_messages: int) -> int:
        return TEMPLATE_TOKENS_PER_MESSAGE * num_messages + TEMPLATE_TOKENS

    def estimate(self, num_chars: int, num_messages: int) -> int:
        return math.ceil(num_chars / self.chars_per_token) + self.template_tokens(num_messages)

    def observe(self, num_chars: int, num_messages: int, prompt_tokens: int | None) -> None:
        if not prompt_tokens or num_chars <= 0:
            return
        self.num_observations += 1
        self.sum_chars += num_chars
        self.sum_text_tokens += max(1, prompt_tokens - self.template_tokens(num_messages))
