"""Sessions: a run's history, environment and events, saved after every step, and reloaded."""
