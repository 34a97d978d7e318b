"""Hyper-parameter search: particle swarm over TOML bounds, maximising mean validation Sharpe."""
