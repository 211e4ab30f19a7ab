"""The engine replay: held-out workflows through a real vLLM-CPU engine, stepped, and the simulator checked
against it."""
