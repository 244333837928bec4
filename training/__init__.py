"""The bundled pair's training tools (`python -m training.train`): run from a clone, not installed."""
