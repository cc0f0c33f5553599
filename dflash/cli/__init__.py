"""Hydra entry points: turn config groups into dataclasses and call library functions."""
