"""Executors: how the engine reaches its workers (one process, or several)."""
