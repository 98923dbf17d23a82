"""The dictionaries a model was trained with, recorded in its configuration: a data-bin with
another dictionary of the same size would load, and translate nonsense."""

import hashlib


def dictionary_fingerprint(dictionary) -> str:
    """A short hash of a fairseq dictionary's symbols in index order (counts ignored): what an
    embedding row means."""
    return hashlib.sha256("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()[:16]


#: where the fingerprints of a model's dictionaries are recorded (its options, its weights' metadata)
DICTIONARY_FINGERPRINTS = ("source_dictionary_fingerprint", "target_dictionary_fingerprint")


def check_dictionaries(args, task) -> None:
    """At the first build, record the fingerprints of the task's dictionaries
    (``{source,target}_dictionary_fingerprint``); when a checkpoint's configuration already
    records them, fail unless the task's dictionaries are the same: a data-bin with another
    dictionary of the same size would load, and translate nonsense."""
    for side in ("source", "target"):
        dictionary = getattr(task, f"{side}_dictionary", None)
        if dictionary is None or not hasattr(dictionary, "symbols"):
            continue
        key, found = f"{side}_dictionary_fingerprint", dictionary_fingerprint(dictionary)
        recorded = getattr(args, key, None)
        if recorded is None:
            setattr(args, key, found)
        elif recorded != found:
            raise ValueError(
                f"the data-bin's {side} dictionary ({len(dictionary)} symbols, fingerprint {found}) is not the one the"
                f" model was trained with (fingerprint {recorded}): use the data-bin the model was trained"
                " on (its dict.*.txt)")
