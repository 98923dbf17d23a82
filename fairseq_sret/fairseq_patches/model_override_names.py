"""The ``model_override_names`` patch: ``load_checkpoint_to_cpu`` sets every
``--model-overrides`` key (and every keyword of ``from_pretrained``) on the checkpoint's
configuration, whether or not any option has that name, so a misspelt override
(``encoder_recursion``) is ignored without a word. Patched: a key that no model, task,
registered component or fairseq setting declares is refused by name, with the closest option
names.
"""

import argparse
import functools
import tempfile

from fairseq import checkpoint_utils
from fairseq.dataclass.configs import FairseqConfig

from .common import probe_checkpoint


@functools.lru_cache(maxsize=1)
def declared_option_names() -> frozenset:
    """Every option name fairseq knows of: its configuration's fields, the fields of every
    registered component's dataclass, and what every registered model and task declares
    with ``add_args``."""
    import dataclasses

    from fairseq.models import MODEL_DATACLASS_REGISTRY, MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_DATACLASS_REGISTRY, TASK_REGISTRY

    names = set()

    def fields_of(cls) -> None:
        for f in dataclasses.fields(cls):
            names.add(f.name)
            if dataclasses.is_dataclass(f.type):
                fields_of(f.type)

    fields_of(FairseqConfig)
    dataclass_types = list(MODEL_DATACLASS_REGISTRY.values()) + list(TASK_DATACLASS_REGISTRY.values())
    classes = list(MODEL_REGISTRY.values()) + list(TASK_REGISTRY.values())
    for registry in REGISTRIES.values():
        dataclass_types += list(registry["dataclass_registry"].values())
        classes += list(registry["registry"].values())
    for cls in dataclass_types:
        if dataclasses.is_dataclass(cls):
            fields_of(cls)
    for cls in classes:
        parser = argparse.ArgumentParser(add_help=False, conflict_handler="resolve")
        try:
            cls.add_args(parser)
        except Exception:  # a component whose options need others first: its dataclass was read
            continue
        names.update(action.dest for action in parser._actions)
    return frozenset(names)


class UnknownOverride(ValueError):
    """A ``--model-overrides`` key that no option has."""


def check_override_names(overrides) -> None:
    """Raise :class:`UnknownOverride` naming the keys of ``overrides`` that are no option."""
    import difflib

    if not overrides:
        return
    known = declared_option_names()
    unknown = sorted(str(k) for k in overrides if k not in known)
    if not unknown:
        return
    hints = [f"{k!r} (did you mean {' or '.join(map(repr, close))}?)" if close else repr(k)
             for k in unknown for close in [difflib.get_close_matches(k, known, n=2, cutoff=0.8)]]
    raise UnknownOverride(f"--model-overrides: no option is called {', '.join(hints)}; an override of another"
                          " name would be ignored")


def _checked_overrides(load):
    @functools.wraps(load)
    def wrapper(path, arg_overrides=None, *args, **kwargs):
        check_override_names(arg_overrides)
        return load(path, arg_overrides, *args, **kwargs)

    wrapper.sret_patch = "model_override_names"
    return wrapper


def fairseq_ignores_unknown_overrides(load=None) -> bool:
    """Does ``load_checkpoint_to_cpu`` load a checkpoint with an override that no option has?"""
    load = load or checkpoint_utils.load_checkpoint_to_cpu
    with tempfile.TemporaryDirectory() as folder:
        path = probe_checkpoint(folder)
        try:
            load(path, {"sret_probe_no_such_option": 1})
        except UnknownOverride:
            return False
        except Exception:
            return True  # failed for another reason: the name was not what stopped it
    return True


def install(patch) -> None:
    patch.replace(checkpoint_utils, "load_checkpoint_to_cpu", _checked_overrides(checkpoint_utils.load_checkpoint_to_cpu))
