"""Shared pytest configuration for the unit tests (fixtures are added here as suites need them)."""

from __future__ import annotations

import pytest
from node_factory import NodeFactory


@pytest.fixture(scope="session")
def nodes() -> NodeFactory:
    """Node builders: `nodes.dgx("a")`, `nodes.t4("b")`, `nodes.mig("c")`, `nodes.cpu("d")`.

    Session-scoped (it is stateless) so hypothesis tests may use it too.
    """
    return NodeFactory()
