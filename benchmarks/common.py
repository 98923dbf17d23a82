"""Shared helpers of the benchmarks (benchmarks/bench_*.py): the shared command-line options,
hardware line, interleaved timing, peak memory, markdown tables and their JSON report.

Timing rule of every benchmark here: the variants that are compared are measured in the
same process, round-robin (variant A, B, C, A, B, C, ...), and the ratio of their median
per-iteration times is the result; absolute times are context only (shared machines are
noisy).
"""

import argparse
import logging
import math
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

#: what the running benchmark printed, for ``--json``: begun by :func:`start_benchmark`, the
#: tables added by :func:`print_table`, written by :func:`finish_benchmark`
_report: dict = {"tables": []}


class BenchmarkParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that knows which shared options it declares (``shared_options``),
    and checks the files the benchmark will write when it reads the command line, before
    anything is measured (:func:`benchmark_outputs`): ``--json`` here, others (a figure) by
    the script. ``output_options``: the options that name files it writes (never inputs)."""

    shared_options: tuple = ()
    output_options: tuple = ("json",)
    _shared_group = None

    def parse_known_args(self, args=None, namespace=None):
        if "--json" in self.shared_options and not any("--force" in a.option_strings for a in self._actions):
            self._shared_group.add_argument("--force", action="store_true",
                                            help="replace a --json file this benchmark did not make")
        global _outputs
        parsed, rest = super().parse_known_args(args, namespace)
        _outputs = None  # a new command line: its own inputs and outputs
        if "--json" in self.shared_options and getattr(parsed, "json", None):
            from fairseq_sret_cli.outputs import OutputInTheWay

            try:
                benchmark_outputs(parsed, [parsed.json], parser=self)
            except OutputInTheWay as exc:
                self.error(str(exc))
        return parsed, rest

    def add_check(self, check: Callable[[argparse.Namespace], Optional[str]]) -> None:
        """A check of options together (``--heads`` divides ``--embed-dim``), run by
        :meth:`parse_args` after each option's own type: ``check(args)`` returns what is wrong
        (one line, naming the options) or None."""
        self.checks.append(check)

    def parse_args(self, args=None, namespace=None):
        """argparse's parsing, then the benchmark's checks (:meth:`add_check`): every refusal is
        ``python -m benchmarks.NAME: error: ...``, exit 2, before any work."""
        parsed = super().parse_args(args, namespace)
        for check in getattr(self, "checks", ()):
            problem = check(parsed)
            if problem:
                self.error(problem)
        return parsed


def benchmark_parser(description: str, *, prog: Optional[str] = None, smoke: Union[bool, str] = True,
                     device: bool = True, threads: bool = True, json: bool = True) -> BenchmarkParser:
    """A benchmark's parser holding the options every benchmark shares; the script adds its own.

    ``--smoke`` (``smoke`` may be its help: what it shrinks), ``--device`` (default ``auto``),
    ``--threads`` (default: torch's own) and ``--json PATH``; False leaves one out, and
    ``parser.set_defaults(device="cpu")`` changes a default. :func:`start_benchmark` applies them.
    """
    if prog is None:  # the caller's module: benchmarks.NAME, also when it runs as __main__
        caller = sys._getframe(1).f_globals
        module = getattr(caller.get("__spec__"), "name", None) or caller.get("__name__", "")
        prog = f"python -m {module}" if module.startswith("benchmarks.") else None
    p = BenchmarkParser(prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.checks = []
    shared = p.add_argument_group("shared benchmark options")
    if smoke:
        shared.add_argument("--smoke", action="store_true",
                            help=smoke if isinstance(smoke, str) else "tiny sizes, seconds (harness check)")
    if device:
        shared.add_argument("--device", default="auto", type=device_option,
                            help="auto (CUDA when available), cpu, cuda or cuda:N (default: %(default)s)")
    if threads:
        shared.add_argument("--threads", type=thread_count, default=None, metavar="N",
                            help="torch.set_num_threads(N) (default: %(default)s; None: torch's own)")
    if json:
        shared.add_argument("--json", metavar="PATH", type=json_path,
                            help="also write the results as JSON to PATH (its folder must exist)")
    p.shared_options = tuple(option for option, on in (("--smoke", smoke), ("--device", device),
                                                       ("--threads", threads), ("--json", json)) if on)
    p._shared_group = shared
    return p


#: the rule every file a benchmark writes follows (fairseq_sret_cli/outputs.py), set by
#: :func:`benchmark_outputs` when the command line is read
_outputs = None


def benchmark_outputs(args: argparse.Namespace, paths, inputs=(), parser: Optional[BenchmarkParser] = None,
                      settings: Optional[dict] = None, own: Optional[Callable[[Path], bool]] = None):
    """The benchmark's :class:`fairseq_sret_cli.outputs.Outputs` for ``paths`` (its report,
    figure, ...), checked now, before anything is measured: a file it did not make is refused
    unless ``--force``, and an input (a file any option names, or ``inputs``, through links)
    even with ``--force``; a folder it cannot write is named. ``settings``: what decides the
    files' content (its own files made with others are refused too); ``own``: recognises its
    files by their content (committed results, which carry no manifest). Raises ``OutputInTheWay``;
    :func:`write_json` and the script's own writes then go through it."""
    global _outputs
    from fairseq_sret_cli.outputs import Outputs

    name = (parser.prog if parser is not None else os.path.basename(sys.argv[0])).removesuffix(".py")
    name = name.removeprefix("python -m benchmarks.")
    skip = set(parser.output_options if parser is not None else ("json",))
    given = []
    for dest, value in vars(args).items():
        if dest in skip:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, (str, Path)) and str(item) and os.path.isfile(item):
                given.append(item)
    if _outputs is None or _outputs.command != name:
        _outputs = Outputs(name)
    _outputs.force, _outputs.settings = bool(getattr(args, "force", False)), settings
    _outputs.add_inputs(*given, *inputs)
    _outputs.check([Path(p) for p in paths], own=own)
    return _outputs


def checked_outputs(parser: BenchmarkParser, args: argparse.Namespace, paths, inputs=(), settings=None, own=None):
    """:func:`benchmark_outputs`, a refusal ending the benchmark as argparse's errors do (one
    line, exit 2): for a script's own files (a figure, a table), right after its command line."""
    from fairseq_sret_cli.outputs import OutputInTheWay

    try:
        return benchmark_outputs(args, paths, inputs=inputs, parser=parser, settings=settings, own=own)
    except OutputInTheWay as exc:
        parser.error(str(exc))


# The types of the benchmarks' numeric options: every count, size, rate and time a benchmark
# takes goes through one of these (argparse names the option in the error), so that a value it
# cannot use is refused when the command line is read, never a traceback or an empty table later.
def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A count or size: an integer >= 1."""
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """A count that may be 0 (warm-up calls, updates, a seed): an integer >= 0."""
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def thread_count(text: str) -> int:
    """``--threads``: an integer from 1 to the processors this machine has."""
    value, most = positive_int(text), os.cpu_count() or 1
    if value > most:
        raise argparse.ArgumentTypeError(f"must be at most the {most} processors of this machine, got {value}")
    return value


def positive_float(text: str) -> float:
    """A rate, time or size: a finite number > 0."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A time or ratio that may be 0 (0: none): a finite number >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text}")
    return value


def finite_float(text: str) -> float:
    """A number of either sign (a length penalty): finite."""
    return _number(text)


def heads_divide_width(heads: str = "heads", width: str = "embed_dim") -> Callable:
    """A check (:meth:`BenchmarkParser.add_check`): the option ``heads`` divides the option ``width``
    (``heads=None``: the width's ``max(1, width // 64)`` heads, as the script derives them)."""
    def check(args):
        c = getattr(args, width)
        h = getattr(args, heads) if heads else max(1, c // 64)
        if c % h:
            given = f"--{heads.replace('_', '-')} {h}" if heads else f"{h} heads (width // 64)"
            return f"{given} must divide --{width.replace('_', '-')} {c}"
        return None
    return check


def groups_divide_a_length(groups: str = "groups", lengths: str = "lengths") -> Callable:
    """A check: every group count of the option ``groups`` divides one of the sequence lengths of
    the option ``lengths`` (a count that divides none would measure nothing)."""
    def check(args):
        given = getattr(args, lengths)
        given = list(given) if isinstance(given, (list, tuple)) else [given]
        idle = [g for g in getattr(args, groups) if not any(length % g == 0 for length in given)]
        if idle:
            return (f"--{groups.replace('_', '-')} {' '.join(map(str, idle))} divides none of the sequence lengths"
                    f" (--{lengths.replace('_', '-')} {' '.join(map(str, given))}): nothing would be measured")
        return None
    return check


#: the types above: a benchmark's numeric option has one of them (tests/test_benchmarks_cli.py)
NUMERIC_TYPES = (positive_int, non_negative_int, thread_count, positive_float, non_negative_float, finite_float)


def device_option(text: str) -> str:
    """``--device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (the devices a benchmark runs on;
    ``meta`` and the like compute nothing); one this machine lacks is refused by
    :func:`pick_device`, before any work."""
    if text != "auto":
        try:
            device = torch.device(text)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise argparse.ArgumentTypeError(f"{text!r} is not a device: give auto, cpu, cuda or cuda:N")
    return text


def missing_device(device: torch.device) -> Optional[str]:
    """Why ``device`` cannot run here (a CUDA device on a machine without it), or None."""
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return f"CUDA is not available to this torch ({torch.__version__}); give --device cpu or auto"
    if (device.index or 0) >= torch.cuda.device_count():
        return f"there are {torch.cuda.device_count()} CUDA devices"
    return None


def json_path(text: str) -> str:
    """``--json``: a file in a folder that exists, checked before the benchmark runs (not
    after it, when its results would be lost)."""
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the path of a file")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{folder}: no such folder")
    return text


def start_benchmark(args: argparse.Namespace, device: Optional[torch.device] = None) -> torch.device:
    """Apply the shared options (``--threads``; ``--device``, unless the script chose
    ``device``), print the command and hardware lines, and begin the ``--json`` report."""
    set_threads(getattr(args, "threads", None))
    if device is None:
        device = pick_device(getattr(args, "device", None))
    _report.clear()
    _report.update(command=command_line(), hardware=hardware_line(device), tables=[])
    print(f"command: {_report['command']}")
    print(f"hardware: {_report['hardware']}", flush=True)
    return device


def finish_benchmark(args: argparse.Namespace, **results) -> None:
    """With ``--json PATH``: write the command, the hardware line, every table printed since
    :func:`start_benchmark` and ``results`` to PATH."""
    if getattr(args, "json", None):
        write_json(args.json, {"command": _report.get("command") or command_line(),
                               "hardware": _report.get("hardware"), "tables": _report["tables"], **results})


def write_json(path, report: dict) -> None:
    """``report`` as strict JSON (:mod:`fairseq_sret.json_text`: NaN and infinity as null)."""
    # not at import: fairseq_sret imported before fairseq's --user-dir hides the plugin's models
    # (bench_fairseq_cli's fairseq processes)
    from fairseq_sret import json_text
    from fairseq_sret_cli.outputs import Outputs

    # under the rule checked when the command line was read: never through a link into a user's
    # file, never over a file the benchmark did not make (unless --force), atomically
    outputs = _outputs or Outputs(os.path.basename(sys.argv[0]).removesuffix(".py"))
    outputs.write_text(Path(path), json_text.dumps(report, indent=1) + "\n")


def pick_device(name: Optional[str]) -> torch.device:
    """The device of ``--device``; a device this machine lacks ends the benchmark with one
    line (exit 2, as argparse's errors) before any work, not a traceback later."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    why = missing_device(device)
    if why:
        print(f"{program()}: error: --device {name}: {why}", file=sys.stderr)
        raise SystemExit(2)
    return device


def set_threads(threads: Optional[int]) -> None:
    if threads:
        torch.set_num_threads(threads)


def cpu_model() -> str:
    """The processor's model name, as the experiment runner records it."""
    from fairseq_sret_cli.hardware import cpu_model as lab_cpu_model

    return lab_cpu_model()


def hardware_line(device: torch.device) -> str:
    """One line naming the device, the software and the threads (printed by every script)."""
    parts = []
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device() if device.index is None else device.index)
        parts.append(f"device: {props.name} ({props.total_memory / 2**30:.0f} GiB)")
        parts.append(f"cuda {torch.version.cuda}")
    else:
        parts.append(f"device: CPU {cpu_model()}")
    parts.append(f"host cores {os.cpu_count()}")
    parts.append(f"torch threads {torch.get_num_threads()}")
    parts.append(f"torch {torch.__version__}")
    parts.append(f"python {platform.python_version()}")
    try:
        parts.append("load avg " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    except OSError:
        pass
    return " | ".join(parts)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}


def default_clock(device: torch.device) -> str:
    """``cpu`` (this process's CPU time) for single-threaded CPU runs, else ``wall``.

    On a shared CPU the wall time of a single-threaded run grows with whatever else the
    machine runs; its CPU time does not (much), so ratios stay comparable.
    """
    return "cpu" if device.type == "cpu" and torch.get_num_threads() == 1 else "wall"


def clock_fn(clock: str) -> Callable[[], float]:
    return _CLOCK[clock]


def clock_note(clock: str) -> str:
    return "process CPU time (single thread)" if clock == "cpu" else "wall-clock time"


def measure(
    fns: Dict[str, Callable[[], object]],
    device: torch.device,
    warmup: int = 2,
    iters: int = 5,
    rounds: int = 3,
    clock: str = "wall",
) -> Dict[str, List[float]]:
    """Seconds per call of every function, measured round-robin.

    Each function first runs ``warmup`` times; then, ``rounds`` times, each function runs
    ``iters`` times in a row and the mean of that run is recorded. Returns
    {name: [seconds per call, one per round]}. ``clock``: ``wall`` or ``cpu``.
    """
    now = _CLOCK[clock]
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    sync(device)
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            start = now()
            for _ in range(iters):
                fn()
            sync(device)
            times[name].append((now() - start) / iters)
    return times


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def peak_memory(fn: Callable[[], object], device: torch.device, warmup: int = 1) -> Optional[int]:
    """Peak bytes allocated by one call of ``fn`` above what was allocated before it.

    ``fn`` first runs ``warmup`` times unmeasured (first calls allocate lasting state such
    as ``.grad`` buffers). CUDA: the caching allocator's statistics. CPU: the allocation
    events of torch's profiler (``profile_memory=True``), summed in time order; None if
    unavailable.
    """
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    except Exception as err:  # profiler internals differ between torch versions
        print(f"warning: CPU peak memory unavailable ({type(err).__name__}: {err})", file=sys.stderr)
        return None
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def mib(nbytes: Optional[int]) -> str:
    return "n/a" if nbytes is None else f"{nbytes / 2**20:.1f}"


def fmt_ratio(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A markdown table under a '### title' line (flushed, so partial logs keep it), kept for ``--json``."""
    _report["tables"].append({"title": title, "headers": list(headers), "rows": [list(map(str, row)) for row in rows]})
    print(f"\n### {title}\n")
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
    print(flush=True)


def program() -> str:
    """The running benchmark as its errors name it: ``python -m benchmarks.NAME``."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    return f"python -m {spec.name}" if spec is not None else os.path.basename(sys.argv[0])


def command_line() -> str:
    """The command that produced the output, for the docs ("python -m benchmarks.NAME ARGS")."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"-m {spec.name}" if spec is not None else os.path.relpath(sys.argv[0], os.getcwd())
    return f"python {program} {shlex.join(sys.argv[1:])}".rstrip()


def quiet_logging() -> None:
    """fairseq's import sets the root logger to DEBUG; keep benchmark logs to the tables."""
    logging.getLogger().setLevel(logging.WARNING)


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def flop_counter():
    """torch's FlopCounterMode, plus the CPU flash-attention kernel it has no formula for."""
    from torch.utils.flop_counter import FlopCounterMode

    custom = {}
    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if op is not None:
        custom[op] = _cpu_sdpa_flops
    return FlopCounterMode(display=False, custom_mapping=custom)


def prepare_as_generate(model, beam: int, bf16: bool = False) -> None:
    """Prepare ``model`` for inference in place as fairseq-generate does
    (``prepare_for_inference_`` with the parts of its config that it reads: eval mode, SReT's
    LRC folded into its weights, and with ``bf16`` on the CPU the cast of ``--bf16``)."""
    from types import SimpleNamespace

    model.prepare_for_inference_(SimpleNamespace(
        common=SimpleNamespace(cpu=True, bf16=bf16, tpu=bf16, memory_efficient_bf16=False),
        generation=SimpleNamespace(beam=beam)))


def profile_table(step, device, title: str, steps: int = 2, rows: int = 15) -> None:
    """Print torch.profiler's top operators of ``steps`` calls of ``step`` (self time on the
    device for CUDA, on the CPU otherwise) and the number of device kernels per call."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync(device)
    averages = prof.key_averages()
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(f"\n#### profile: {title} ({steps} calls, sorted by self {'CUDA' if cuda else 'CPU'} time)\n")
    try:
        table = averages.table(sort_by=sort, row_limit=rows, max_name_column_width=70)
    except Exception:  # older torch names the column self_cuda_time_total
        table = averages.table(sort_by="self_cuda_time_total" if cuda else sort, row_limit=rows)
    print(table)
    if cuda:
        kernels = sum(1 for e in prof.events() if getattr(e, "device_type", None) is not None
                      and str(e.device_type).endswith("CUDA"))
        print(f"device kernels per call: {kernels / steps:.0f}")
    else:
        ops = sum(e.count for e in averages if e.key.startswith("aten::"))
        print(f"aten operator calls per call (nested included): {ops / steps:.0f}")
    print(flush=True)
