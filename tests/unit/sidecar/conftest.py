"""Fixtures of the sidecar unit tests: the demo CNN's weights, endpoint and reference (tests/sidecar_fixtures.py).
Tests that start a sidecar live in tests/integration/sidecar."""

from tests.sidecar_fixtures import endpoint, reference, weights  # noqa: F401  (fixtures, found by name)
