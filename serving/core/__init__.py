"""The decision core: what every runtime asks, with no clock and no I/O of its own.

The gateway (`serving/gateway`), the simulator (`serving/sim`) and the vLLM plugin (`serving/vllm_plugin`) drive
these objects with the same inputs: a stage waiting for a slot (`request.py`), the systems table (`systems.py`),
the scheduler policies (`scheduler/`), admission and KV sizing (`admission/`), the dispatch core (`dispatch.py`),
node choice (`routing.py`), model residency (`residency.py`), MARS's keep-or-evict rule and Maestro's (`tool_kv.py`)
and the KV allocator (`kv/`). Time comes in as an argument; nothing here reads a clock, a socket or a file.
"""
