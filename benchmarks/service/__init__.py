"""The predictor service: a real `bentoml serve` under load, BentoML's own share of it, and the online correction."""
