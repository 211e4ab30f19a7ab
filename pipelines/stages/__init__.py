"""The DVC stages' entry points, one script a stage (`python -m pipelines.stages.<stage>`, as dvc.yaml runs them).

Each reads its own `params.yaml` section and the paths dvc.yaml passes, calls the library in `pipelines/` (the
pure functions that `maestro train`, the predictor service, the benchmarks and the tests import too), writes the
stage's outputs and prints a line on what it did. Nothing imports these scripts but their tests.
"""
