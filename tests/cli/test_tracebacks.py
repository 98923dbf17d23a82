"""SRET_TRACEBACK: a traceback only when it asks for one."""

import pytest

from fairseq_sret_cli import UserError, user_errors


@user_errors("sret-example")
def failing_main():
    raise UserError("the input is wrong")


@pytest.mark.parametrize("value", [None, "", "0", "no", "false", "OFF"])
def test_an_error_is_one_line_unless_asked(monkeypatch, capsys, value):
    if value is None:
        monkeypatch.delenv("SRET_TRACEBACK", raising=False)
    else:
        monkeypatch.setenv("SRET_TRACEBACK", value)
    assert failing_main() == 1
    assert capsys.readouterr().err == "sret-example: error: the input is wrong\n"


@pytest.mark.parametrize("value", ["1", "yes", "true"])
def test_sret_traceback_shows_the_traceback(monkeypatch, value):
    monkeypatch.setenv("SRET_TRACEBACK", value)
    with pytest.raises(UserError, match="the input is wrong"):
        failing_main()
