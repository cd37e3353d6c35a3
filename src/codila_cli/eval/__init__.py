"""Evaluation: prompt sets, decoder settings sweeps, summaries and plots."""
