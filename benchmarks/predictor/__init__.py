"""The predictor's accuracy, cost and training: recipes against baselines, speed, batch, CV choices, the workflow model,
new apps, scale."""
