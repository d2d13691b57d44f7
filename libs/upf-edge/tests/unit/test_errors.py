"""ntfy's error body: the "link" ntfy's errors.go gives some codes, and none for the others."""

from __future__ import annotations

import json

from upf_edge.errors import ErrorBody, NtfyError, Problem, error_body

LIMITS_DOCS = "https://ntfy.sh/docs/publish/#limitations"


def test_a_problem_with_a_link_writes_it_after_error_as_ntfy_does() -> None:
    problem = Problem(42901, 429, "limit reached: too many requests", LIMITS_DOCS)
    assert error_body(problem) == (
        b'{"code":42901,"http":429,"error":"limit reached: too many requests",'
        b'"link":"https://ntfy.sh/docs/publish/#limitations"}\n'
    )
    assert problem.body() == error_body(problem)
    assert NtfyError(problem).problem.link == LIMITS_DOCS


def test_a_problem_without_a_link_has_no_link_key() -> None:
    problem = Problem(40009, 400, "invalid request: topic invalid")
    assert problem.link == "" and "link" not in json.loads(error_body(problem))
    assert ErrorBody(40009, 400, "x") == ErrorBody(40009, 400, "x", "")
