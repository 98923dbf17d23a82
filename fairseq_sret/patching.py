"""How fairseq-sret changes a dependency's behaviour: a :class:`PatchSet` per dependency (fairseq:
:mod:`fairseq_sret.fairseq_patches`; transformers: :mod:`fairseq_sret.hf.transformers_patches`),
one :class:`Patch` per defect, no dependency imported here.

Each patch names the upstream defect it works around and has a probe that shows the defect on
the installed package; a patch whose probe finds the package already behaving is skipped. A
set records what it did (:attr:`PatchSet.applied`) and says it in one log line. Every
replacement a patch makes is recorded (:class:`Installation`), so :meth:`PatchSet.remove`
restores the package as it was (last installed, first removed) and :meth:`PatchSet.removed`
does it for the length of a ``with`` block (tests). An environment variable per set chooses
what may be applied: unset or ``all`` (each patch its probe asks for), ``none``, or names to
leave out, each with a ``-`` (``-cpu_ddp,-keep_last_batch``).
"""

import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple


class Installation:
    """What one patch changed, to undo it: ``replace(owner, name, value)`` sets an attribute
    and remembers the old value; ``on_removal(undo)`` adds any other step (an ``atexit``
    hook). :meth:`remove` undoes them, last first."""

    def __init__(self, name: str):
        self.name = name
        self._undo: List[Callable[[], None]] = []

    def replace(self, owner, attribute: str, value) -> None:
        old = getattr(owner, attribute)
        setattr(owner, attribute, value)
        self._undo.append(lambda: setattr(owner, attribute, old))

    def on_removal(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


@dataclass(frozen=True)
class Patch:
    name: str
    defect: str
    #: the probe: True where the installed package has the defect
    has_defect: Callable[[], bool]
    #: ``install(installation)``: makes the change through :meth:`Installation.replace`
    install: Callable[[Installation], None]
    #: the upstream report of the defect ("" where none was found)
    upstream: str = ""
    #: the patches that wrap the same function and must be installed first (inside)
    after: Tuple[str, ...] = ()
    #: the attributes the patch replaces, ``module.attribute``
    replaces: Tuple[str, ...] = field(default=())


def check_order(patches: Sequence[Patch]) -> None:
    """ValueError unless every patch comes after the patches it names in ``after``, and any two
    patches that replace one attribute say which comes first (their result depends on it)."""
    position = {patch.name: i for i, patch in enumerate(patches)}
    for i, patch in enumerate(patches):
        for inner in patch.after:
            if position.get(inner, len(patches)) >= i:
                raise ValueError(f"patch {patch.name} must come after {inner}")
        for earlier in patches[:i]:
            shared = set(patch.replaces) & set(earlier.replaces)
            if shared and earlier.name not in patch.after:
                raise ValueError(f"patches {earlier.name} and {patch.name} both replace {sorted(shared)};"
                                 f" {patch.name}.after must name {earlier.name}")


class PatchSet:
    """The patches of one dependency, in installation order (checked by :func:`check_order`)."""

    def __init__(self, dependency: str, patches: Sequence[Patch], env: str, logger: logging.Logger, docs: str):
        check_order(patches)
        self.dependency, self.patches, self.env, self.logger, self.docs = dependency, tuple(patches), env, logger, docs
        #: ``{patch name: "applied" | "not needed" | "turned off"}`` once :meth:`apply` has run
        self.applied: Dict[str, str] = {}
        self._installed: List[Installation] = []

    def turned_off(self, value: Optional[str]) -> Set[str]:
        """The patch names that ``{env}=value`` leaves out; ValueError naming the variable, the
        unknown names and the known ones."""
        names = [p.name for p in self.patches]
        text = (value or "").strip()
        if text in ("", "all"):
            return set()
        if text == "none":
            return set(names)
        items = [item.strip() for item in text.split(",") if item.strip()]
        wrong = [item for item in items if not item.startswith("-") or item[1:] not in names]
        if wrong:
            raise ValueError(
                f"{self.env}={value!r}: {', '.join(wrong)} not understood; give 'all', 'none' or patch names to"
                f" leave out, each with a '-' (e.g. -{names[0]}); the patches: {', '.join(names)}"
            )
        return {item[1:] for item in items}

    def probe(self, patch: Patch) -> bool:
        """``patch.has_defect()``, or True where the probe itself fails (a temporary folder that is
        read-only or full, ...): each patch changes only what its defect breaks, so applying one
        that was not needed is harmless, while an error here would stop every command."""
        try:
            return patch.has_defect()
        except Exception as exc:
            self.logger.warning("fairseq_sret cannot probe %s for %s (%s: %s); applying the patch",
                                self.dependency, patch.name, type(exc).__name__, exc)
            return True

    def _install(self, patch: Patch) -> None:
        installation = Installation(patch.name)
        try:
            patch.install(installation)
        except BaseException:
            installation.remove()  # nothing half-installed
            raise
        self._installed.append(installation)

    def apply(self) -> Dict[str, str]:
        """Probe the installed package and install the patches it needs and the environment
        allows (each once per process); one log line lists the outcome."""
        turned_off = self.turned_off(os.environ.get(self.env))
        new = [patch for patch in self.patches if patch.name not in self.applied]
        for patch in new:
            if patch.name in turned_off:
                self.applied[patch.name] = "turned off"
            elif self.probe(patch):
                self._install(patch)
                self.applied[patch.name] = "applied"
            else:
                self.applied[patch.name] = "not needed"
        if new:
            def listed(outcome):
                return ", ".join(p.name for p in new if self.applied[p.name] == outcome) or "none"

            self.logger.info("%s patches applied: %s; not needed: %s; turned off (%s): %s (%s)", self.dependency,
                             listed("applied"), listed("not needed"), self.env, listed("turned off"), self.docs)
        return dict(self.applied)

    def remove(self) -> List[str]:
        """Undo every applied patch, the last installed first, leaving the package as it was;
        returns their names in the order they had been applied. :meth:`apply` may run again."""
        removed = [installation.name for installation in self._installed]
        while self._installed:
            self._installed.pop().remove()
        self.applied.clear()
        return removed

    @contextlib.contextmanager
    def removed(self) -> Iterator[None]:
        """The package without the patches inside the block, with them again after it (tests)."""
        had = bool(self.applied)
        self.remove()
        try:
            yield
        finally:
            if had:
                self.apply()
