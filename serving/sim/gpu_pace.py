"""A model's pace on the simulated GPU, the simulator's `serving.core.request.ServicePace`: prefill + lone decode."""

from __future__ import annotations

from dataclasses import dataclass

from serving.sim.costmodel import CostModel, ModelProfile


@dataclass(frozen=True)
class ModelPace:
    """Seconds a stage of `model` takes alone on one of the simulated GPUs (`CostModel`)."""

    cost: CostModel
    model: ModelProfile

    @classmethod
    def of(cls, cost: CostModel, model_name: str) -> ModelPace:
        return cls(cost, cost.model(model_name))

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.cost.prefill_s(self.model, prompt_tokens) + self.cost.decode_s(
            self.model, output_tokens, prompt_tokens
        )
