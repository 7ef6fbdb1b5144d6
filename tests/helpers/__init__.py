"""Shared test utilities (multi-process launch)."""
