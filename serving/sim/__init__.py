"""The cluster simulator: a discrete-event clock driving the serving objects over N nodes (DESIGN §5)."""
