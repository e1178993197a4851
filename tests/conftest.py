"""Shared pytest configuration for the NeuroNetes test suite (fixtures are added here as suites need them)."""
