"""``fairseq-hydra-train``: the ``model:`` section of a YAML config, checked like the command line.

``sret_transformer`` is registered the command-line way (``add_args`` + named architecture
functions), as fairseq's own ``transformer`` is. fairseq 0.12 builds such a model from a
hydra config without a dataclass: ``model._name`` picks the architecture, whose function
fills the defaults into the ``DictConfig`` and ``build_model`` receives it. Nothing checks
the keys or their types on that path, so a misspelt option would be ignored and
``no_lrc: "yes"`` would be read as true. :func:`namespace_from_config` closes that gap with
the command line's own parser: every key must be one of its options, each value is converted
as argparse converts the option's text (``"3"`` -> 3 for an int, ``two`` fails) and checked
against its choices, and the result is the ``argparse.Namespace`` the command line would
have produced, so the model is then built, and checked by ``check_sret_options``, exactly
as on the command line.
"""

import argparse
import difflib
import os
from typing import Dict

from fairseq.models import ARCH_CONFIG_REGISTRY
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

# hydra prints a configuration error and then, as the last line, a hint about this variable;
# with it set the error itself is the last line, as with fairseq-train
os.environ.setdefault("HYDRA_FULL_ERROR", "1")

#: keys fairseq itself puts in a model config that are not command-line options
_NOT_OPTIONS = {"_name", "decoder_input_dim"}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # pragma: no cover - add_args never errors
        raise ValueError(message)


def _options(model_cls) -> Dict[str, argparse.Action]:
    parser = _Parser(add_help=False)
    model_cls.add_args(parser)
    return {action.dest: action for action in parser._actions if action.option_strings}


def _flag(action) -> str:
    return max(action.option_strings, key=len)


def _convert(key, value, action):
    """``value`` as argparse would store it for option ``action``; errors in argparse's words."""
    flag = _flag(action)
    if value is None:  # left unset by the architecture (e.g. adaptive_softmax_cutoff)
        return None
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ValueError(f"argument {flag} (model.{key}): expected true or false, got {value!r}")
        return value
    kind = action.type  # None (fairseq's interpolated defaults, e.g. decoder_output_dim): as is
    if isinstance(value, (list, ListConfig)) and kind is str:
        value = ",".join(str(v) for v in value)  # encoder_groups: [2, 1] -> "2,1"
    if kind in (int, float, str):
        # argparse converts the option's text: the text of the YAML value
        if isinstance(value, bool) and kind is not str:
            raise ValueError(f"argument {flag} (model.{key}): invalid {kind.__name__} value: {value!r}")
        try:
            value = kind(str(value))
        except ValueError:
            raise ValueError(f"argument {flag} (model.{key}): invalid {kind.__name__} value: {str(value)!r}") from None
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(repr(c) for c in action.choices)
        raise ValueError(f"argument {flag} (model.{key}): invalid choice: {value!r} (choose from {choices})")
    return value


def namespace_from_config(model_cls, cfg: DictConfig, task=None) -> argparse.Namespace:
    """The command-line namespace equivalent to model config ``cfg`` (already completed by the
    architecture function), after the command line's checks of every key and value. A key
    set to null counts as not given (its architecture default), as leaving out the flag.

    Converted values are written back to ``cfg`` (it is saved in the checkpoint). A config
    without ``max_source_positions``/``max_target_positions`` takes the task's, as the one
    command-line flag sets both.
    """
    options = _options(model_cls)
    nulls = [key for key in cfg.keys() if key != "_name" and cfg[key] is None]
    if nulls:  # `key: null` means not given: the architecture's default, as on the command line
        with open_dict(cfg):
            for key in nulls:
                del cfg[key]
            ARCH_CONFIG_REGISTRY[cfg._name](cfg)
    values = {}
    for key in cfg.keys():
        if key in _NOT_OPTIONS:
            values[key] = cfg[key]
            continue
        action = options.get(key)
        if action is None:
            close = difflib.get_close_matches(key, list(options), n=1)
            hint = f"; did you mean model.{close[0]}?" if close else ""
            raise ValueError(
                f"unrecognized model option model.{key} (--{key.replace('_', '-')}) for"
                f" {model_cls.__name__}{hint}"
            )
        values[key] = _convert(key, cfg[key], action)
    task_cfg = getattr(task, "cfg", None)
    for key in ("max_source_positions", "max_target_positions"):
        if values.get(key) is None and getattr(task_cfg, key, None) is not None:
            values[key] = getattr(task_cfg, key)
    with open_dict(cfg):
        for key, value in values.items():
            cfg[key] = value
    return argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True))
