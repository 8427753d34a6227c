"""docs/RELIABILITY.md stays true: every test it names exists, and every bound it quotes as `NAME = value`
equals that constant in the test module of the same row."""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "RELIABILITY.md")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")
BOUND = re.compile(r"`([A-Z][A-Z0-9_]*) = ([0-9][0-9_.]*)`")
# Tests of other branches the table points to (see the ETL row); they are checked once merged.
ELSEWHERE = {"tests/e2e/test_etl.py"}


def table_rows() -> list[str]:
    with open(DOC) as f:
        return [line for line in f if line.startswith("| ") and not line.startswith("| ---")]


def module_facts(path: str) -> tuple[set[str], dict[str, object]]:
    """Test function names and module-level constants of a test file, read without importing it."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    return functions, constants


def test_every_named_test_exists():
    named = [(path, name) for row in table_rows() for path, name in TEST_REF.findall(row)]
    assert len(named) >= 25, "the tables should name the tests behind them"
    for path, name in named:
        if path in ELSEWHERE:
            continue
        assert os.path.exists(os.path.join(ROOT, path)), f"{path} does not exist"
        if name:
            functions, _ = module_facts(path)
            assert name in functions, f"{path}::{name} does not exist"


def test_every_quoted_bound_is_the_tests_constant():
    checked = 0
    for row in table_rows():
        bounds = BOUND.findall(row)
        if not bounds:
            continue
        paths = {path for path, _ in TEST_REF.findall(row)} - ELSEWHERE
        assert len(paths) == 1, f"a row with bounds must name one test file: {row}"
        _, constants = module_facts(paths.pop())
        for name, value in bounds:
            assert name in constants, f"{name} is not a constant of the test in: {row}"
            assert float(constants[name]) == float(value), \
                f"{name} is {constants[name]} in the test, {value} in the doc"
            checked += 1
    assert checked >= 10
