"""Distributed helpers: pipeline-parallel layer partition (``utils``) and process groups."""
