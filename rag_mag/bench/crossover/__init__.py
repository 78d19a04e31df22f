"""The crossover study: its config, runs and cells, measurement, tuning, published checkpoints and report."""
