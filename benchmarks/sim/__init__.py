"""The simulator: its speed, and replayed real workflows across loads."""
