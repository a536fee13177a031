"""Hostile rule files (``.egg``) given to ``optimize --rules`` and ``rules check``, each in a capped process
(tests/hostile.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hostile import Cases, check_one_clear_error, linear

CASES: Cases = {
    "rule syntax": ({"g.json": linear(), "r.egg": "(rewrite (Relu ?x"}, ["optimize", "{graph}", "--rules",
                                                                        "{folder}/r.egg"], "r.egg:1: parse error"),
    "rule nested 100k deep": ({"g.json": linear(), "r.egg": "(rewrite " + "(Relu " * 100_000 + "?x" + ")" * 100_000
                               + ' ?x :name "deep")'}, ["rules", "check", "{folder}/r.egg"],
                              "r.egg:1: parentheses nest 100001 deep; a rule file may nest at most 200"),
    "rule panics when it runs": ({"g.json": linear(), "r.egg": '(rule ((= ?m (MatMul ?x ?w))) ((panic "no")) '
                                                               ':ruleset fuse :name "boom")'},
                                 ["optimize", "{graph}", "--rules", "{folder}/r.egg"],
                                 "r.egg:1: rule 'boom' failed at run time (stage fuse): it panicked: no"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_input_is_one_clear_error_within_the_caps(case: str, runner: subprocess.Popen,
                                                            tmp_path: Path) -> None:
    check_one_clear_error(*CASES[case], runner, tmp_path)
