"""The load driver: runs catalog workflows end to end against the gateway or straight at vLLM."""
