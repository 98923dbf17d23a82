"""The recursion schedule: what every application of a shared layer does.

A shared layer ``F`` applied ``N`` times (paper Eq. 6, ``z = NLL_N(F(... NLL_1(F(z))))``)
is described by one :class:`RecursionSchedule` of ``N`` :class:`RecursionStep` entries.
Each step says, for its application:

- ``index``: the recursion index ``r`` (0-based);
- ``groups`` and ``partition``: the sliced group self-attention of that application
  (paper Sec. 4: ``G`` groups, formed ``contiguous``-ly, ``strided`` or ``random``-ly);
- ``nll``: which of the layer's non-shared NLLs follows the application (its own,
  ``NLL_{r+1}``, index ``r``, unless a schedule says otherwise; None: none);
- ``runs``: whether the application runs at all. A schedule trained with ``N``
  recursions can run only its first ``d`` applications (:meth:`RecursionSchedule.with_depth`):
  the later applications and their NLLs are skipped, nothing is re-initialised.

The step is passed as ``recursion=`` to the layer and from there to every sub-module of
the application (attention, FFN, NLL), so a new per-recursion behaviour is one new field
here, not a new code path.

User values (command-line strings such as ``"8,2"``, ints, tuples) go through one parser,
:meth:`RecursionSchedule.parse`, with one validator and one error style: every error is a
``ValueError`` that names the option it is about (``--encoder-groups``, ``groups``, ...).
Every count of applications (``recursions``, a depth, a mixed-depth term) is checked by
:func:`check_depth`.
"""

from dataclasses import dataclass, replace
from typing import Iterator, Mapping, Optional, Sequence, Tuple, Union

from .partition import PARTITION_MODES

#: ``partition="auto"``: the official SReT scheme (contiguous slices first, a permuted
#: partition in the later applications); causal layers start strided, because the
#: boundaries of contiguous slices depend on the final length, which is unknown while
#: decoding step by step.
AUTO_PARTITION = {False: ("contiguous", "random"), True: ("strided", "random")}

Values = Union[int, str, Sequence]


@dataclass(frozen=True)
class RecursionStep:
    """One application of a shared layer (see the module docstring).

    A step stands for its recursion index where an index is expected: ``values[step]`` and
    ``int(step)`` use :attr:`index`. It equals only a step with the same fields, never an int.
    """

    index: int = 0
    groups: int = 1
    partition: str = "contiguous"
    nll: Optional[int] = 0
    runs: bool = True

    def __index__(self) -> int:
        return self.index

    def __int__(self) -> int:
        return self.index


def check_depth(
    depth, recursions: Optional[int] = None, name: str = "depth",
    built: str = "the layer was built (and trained) with", fix: Optional[str] = None,
) -> int:
    """The one check of a count of applications: an integer >= 1 and, given ``recursions``
    (the applications a layer was built with), at most that many.

    Errors name the value as ``name``; ``built`` says who was built with ``recursions`` and
    ``fix`` replaces the default advice (``use a depth from 1 to N``). Returns ``depth``.
    """
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {depth!r}")
    if recursions is not None and depth > recursions:
        raise ValueError(
            f"{name}={depth} is larger than the {recursions} recursions {built}; "
            + (fix or f"use a depth from 1 to {recursions}")
        )
    return depth


def _split(value: Values, option: str, cast) -> Tuple:
    """``"8,2"`` / ``8`` / ``(8, 2)`` -> a non-empty tuple of ``cast`` values."""
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
        if not value.strip() or any(not v for v in items):
            raise ValueError(f"{option} must be a comma-separated list, got {value!r}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        items = [value]
    else:
        items = list(value)
        if not items:
            raise ValueError(f"{option} must not be empty")
    parsed = []
    for item in items:
        if cast is int:
            if isinstance(item, bool) or (isinstance(item, float) and not item.is_integer()):
                raise ValueError(f"{option} values must be integers, got {value!r}")
            try:
                parsed.append(int(item) if not isinstance(item, str) else int(item.strip()))
            except ValueError:
                raise ValueError(f"{option} values must be integers, got {value!r}") from None
        else:
            parsed.append(str(item).strip())
    return tuple(parsed)


def _per_recursion(values: Tuple, recursions: int, option: str, repeat_last: bool) -> Tuple:
    """One value for every recursion: one value applies to all; ``repeat_last`` lets a
    shorter list repeat its last entry; a longer list is an error."""
    if len(values) == recursions:
        return values
    if len(values) == 1 or (repeat_last and len(values) < recursions):
        return values + values[-1:] * (recursions - len(values))
    allowed = f"1 to {recursions}" if repeat_last else f"1 or {recursions}"
    raise ValueError(
        f"{option} has {len(values)} values but there are {recursions} recursions; give {allowed}"
    )


@dataclass(frozen=True)
class RecursionSchedule:
    """The steps of a shared layer's applications, in order (see the module docstring).

    Build it with :meth:`parse`. ``len(schedule)`` is the number of applications the
    layer was built (and trained) with; :attr:`depth` how many of them run.
    """

    steps: Tuple[RecursionStep, ...]
    causal: bool = False

    def __post_init__(self):
        if not self.steps:
            raise ValueError("a recursion schedule needs at least one step")
        if any(s.index != i for i, s in enumerate(self.steps)):
            raise ValueError("recursion steps must be indexed 0, 1, 2, ... in order")
        runs = [s.runs for s in self.steps]
        if not runs[0] or runs != sorted(runs, reverse=True):
            raise ValueError("the applications that run must be a non-empty prefix of the schedule")

    # ------------------------------------------------------------------ building
    @classmethod
    def parse(
        cls,
        recursions: Optional[int] = None,
        groups: Values = 1,
        partition: Values = "contiguous",
        causal: bool = False,
        nll: bool = True,
        depth: Optional[int] = None,
        repeat_last: bool = False,
        names: Optional[Mapping[str, str]] = None,
    ) -> "RecursionSchedule":
        """Build and validate a schedule from user values.

        Args:
            recursions: N, the applications of the shared layer. None: as many as the
                longest of ``groups``/``partition`` lists (1 for single values).
            groups: group count per recursion: an int, ``"8,2"`` or a sequence. One value
                applies to every recursion.
            partition: partition mode per recursion, same forms; ``"auto"`` resolves to
                :data:`AUTO_PARTITION`.
            causal: the layer's self-attention is causal (decoder): ``contiguous`` slices
                with more than one group are rejected.
            nll: every application is followed by its own NLL (index ``r``), when the
                layer has NLLs; False: by none.
            depth: run only the first ``depth`` applications (default: all).
            repeat_last: a list shorter than ``recursions`` repeats its last entry
                (otherwise it must list 1 or N values).
            names: how errors name the options, e.g. ``{"groups": "--encoder-groups"}``;
                keys ``recursions``, ``groups``, ``partition``, ``depth``.
        Raises:
            ValueError naming the offending option.
        """
        names = {"recursions": "recursions", "groups": "groups", "partition": "partition",
                 "depth": "depth", **(names or {})}
        group_values = _split(groups, names["groups"], int)
        auto = isinstance(partition, str) and partition.strip() == "auto"
        mode_values = None if auto else _split(partition, names["partition"], str)
        if recursions is None:
            recursions = max(len(group_values), 1 if mode_values is None else len(mode_values))
        check_depth(recursions, name=names["recursions"])
        group_values = _per_recursion(group_values, recursions, names["groups"], repeat_last)
        if any(g < 1 for g in group_values):
            raise ValueError(f"{names['groups']} values must be >= 1, got {list(group_values)}")
        if auto:
            first, later = AUTO_PARTITION[bool(causal)]
            mode_values = (first,) + (later,) * (recursions - 1)
        mode_values = _per_recursion(mode_values, recursions, names["partition"], repeat_last)
        for mode in mode_values:
            if mode not in PARTITION_MODES:
                raise ValueError(
                    f"{names['partition']}: unknown partition mode {mode!r}; allowed values: {', '.join(PARTITION_MODES)}"
                )
        for r, (g, mode) in enumerate(zip(group_values, mode_values)):
            if causal and g > 1 and mode == "contiguous":
                raise ValueError(
                    f"{names['partition']}: 'contiguous' cannot be used with {names['groups']} > 1 in a"
                    f" causal layer (recursion {r}): slice boundaries depend on the final length,"
                    " which is unknown during incremental decoding; allowed values: strided, random"
                )
        steps = tuple(
            RecursionStep(index=r, groups=g, partition=m, nll=r if nll else None)
            for r, (g, m) in enumerate(zip(group_values, mode_values))
        )
        schedule = cls(steps, causal=bool(causal))
        return schedule if depth is None else schedule.with_depth(depth, name=names["depth"])

    def with_depth(
        self, depth: Optional[int], name: str = "depth",
        built: str = "the layer was built (and trained) with", fix: Optional[str] = None,
    ) -> "RecursionSchedule":
        """The same schedule running only its first ``depth`` applications (None: all).

        Raises ValueError (:func:`check_depth`, with ``name``, ``built`` and ``fix``) when
        ``depth`` is not an integer from 1 to the applications the layer was built with.
        """
        if depth is None:
            depth = len(self.steps)
        check_depth(depth, len(self.steps), name, built=built, fix=fix)
        if self.depth == depth:
            return self  # the same object: torch.compile's guards on it still hold
        return replace(self, steps=tuple(replace(s, runs=s.index < depth) for s in self.steps))

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[RecursionStep]:
        return iter(self.steps)

    def __getitem__(self, index: int) -> RecursionStep:
        return self.steps[index]

    @property
    def depth(self) -> int:
        """How many applications run."""
        return sum(s.runs for s in self.steps)

    def running(self) -> Tuple[RecursionStep, ...]:
        """The steps that run, in order."""
        return self.steps[: self.depth]

    def step(self, recursion: Union[int, RecursionStep]) -> RecursionStep:
        """The step of recursion index ``recursion`` (a step is returned as it is).

        A one-step schedule applies to every index (``groups=8`` means 8 groups in
        whichever application asks).
        """
        if isinstance(recursion, RecursionStep):
            return recursion
        if len(self.steps) == 1:
            return self.steps[0]
        if not 0 <= recursion < len(self.steps):
            raise IndexError(
                f"recursion index {recursion} out of range: the schedule has {len(self.steps)} recursions"
            )
        return self.steps[recursion]

    def expand(self, recursions: int) -> "RecursionSchedule":
        """This schedule for ``recursions`` applications: a one-step schedule is repeated."""
        if len(self.steps) == recursions:
            return self
        if len(self.steps) == 1:
            first = self.steps[0]
            return replace(self, steps=tuple(
                replace(first, index=r, nll=None if first.nll is None else r) for r in range(recursions)
            ))
        raise ValueError(
            f"the layer's schedule lists {len(self.steps)} recursions, but {recursions} were asked for"
        )

    @property
    def groups(self) -> Tuple[int, ...]:
        return tuple(s.groups for s in self.steps)

    @property
    def partitions(self) -> Tuple[str, ...]:
        return tuple(s.partition for s in self.steps)

    def describe(self) -> str:
        """``"[8 contiguous, 2 random+NLL]"``-style summary (for ``extra_repr`` and logs)."""
        parts = []
        for s in self.steps:
            text = f"{s.groups} {s.partition}" + ("" if s.nll is None else f"+NLL{s.nll + 1}")
            parts.append(text if s.runs else f"({text}: skipped)")
        return "[" + ", ".join(parts) + "]"
