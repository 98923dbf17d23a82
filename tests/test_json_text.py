"""Every JSON the project writes is JSON: no NaN or Infinity, which Python's ``json`` writes by
default and strict readers (JavaScript, jq, most other languages) refuse."""

import json
import math
import re

import pytest

from conftest import REPO
from fairseq_sret import json_text


def strict_loads(text: str):
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.reliability("inputs-as-they-seem")
def test_values_that_are_not_finite_become_null_at_any_depth():
    value = {"loss": math.nan, "ratio": math.inf, "curve": [1.5, -math.inf, (2.0, math.nan)], "ok": 3, "name": "x",
             "nested": {"bleu": float("nan"), "flag": True, "none": None}}
    text = json_text.dumps(value, indent=1)
    assert strict_loads(text) == {"loss": None, "ratio": None, "curve": [1.5, None, [2.0, None]], "ok": 3,
                                  "name": "x", "nested": {"bleu": None, "flag": True, "none": None}}
    assert json_text.dumps({"b": 1, "a": [1.0]}, sort_keys=True) == json.dumps({"b": 1, "a": [1.0]}, sort_keys=True)
    with pytest.raises(TypeError):
        json_text.dumps({"path": object()})


@pytest.mark.reliability("inputs-as-they-seem")
def test_every_writer_of_the_project_writes_through_json_text():
    """The class-level check: any ``json.dump``/``json.dumps`` left in the library, the lab or
    the benchmarks could write NaN again."""
    offenders = []
    for folder in ("fairseq_sret", "fairseq_sret_cli", "benchmarks", "scripts"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "json_text.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if re.search(r"\bjson\.dumps?\(", line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert not offenders, offenders
