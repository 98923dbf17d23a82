"""Names of the attention seam's parts: attention layers, grouped-attention strategies and
attention kernels, each registered under a name and looked up by it (one-line errors that
list what is registered)."""

from typing import Callable, Dict, Iterator, TypeVar

T = TypeVar("T")


class Registry:
    """Named parts of one kind (``what``: how an error calls them)."""

    def __init__(self, what: str):
        self.what = what
        self._parts: Dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: the decorated function or class is the part called ``name``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.what} is registered under a non-empty name, got {name!r}")

        def add(part: T) -> T:
            if name in self._parts and self._parts[name] is not part:
                raise ValueError(f"{self.what} {name!r} is already registered ({self._parts[name].__qualname__})")
            self._parts[name] = part
            return part

        return add

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a part registered for a while, as a test's)."""
        self[name]  # ValueError when not registered
        del self._parts[name]

    def __getitem__(self, name: str) -> Callable:
        part = self._parts.get(name) if isinstance(name, str) else None
        if part is None:
            raise ValueError(f"unknown {self.what} {name!r}; registered: {', '.join(self._parts)}")
        return part

    def __contains__(self, name) -> bool:
        return name in self._parts

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def names(self) -> str:
        """The registered names, comma-separated (for messages)."""
        return ", ".join(self._parts)


#: attention layers a :class:`~fairseq_sret.core.SReTBlock` can be built with (the package's
#: docstring says what their constructor and forward take)
ATTENTION_LAYERS = Registry("attention layer")
#: how self-attention inside groups of tokens is computed: ``fn(attn, qkv, valid, groups, mode)``
#: (:mod:`.grouped`)
GROUPED_ATTENTION = Registry("grouped attention strategy")
#: ``fn(q, k, v, mask, dropout, is_causal) -> out`` (:mod:`.kernels`)
ATTENTION_KERNELS = Registry("attention kernel")

DEFAULT_ATTENTION_LAYER = "sliced_group"


def register_attention_layer(name: str) -> Callable[[T], T]:
    """Decorator: register an attention layer class under ``name`` (``SReTLayerSpec(attention=name)``)."""
    return ATTENTION_LAYERS.register(name)


def attention_layer(name: str) -> Callable:
    """The attention layer registered as ``name``; ValueError listing the registered names."""
    return ATTENTION_LAYERS[name]
