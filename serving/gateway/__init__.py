"""The gateway: an OpenAI-compatible proxy that predicts, admits, schedules and traces each stage (DESIGN §5)."""
