"""The benchmarks' one entry point (``python -m benchmarks NAME``) and the options they share."""

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS, main
from benchmarks.common import (
    BenchmarkParser, benchmark_parser, finish_benchmark, print_table, start_benchmark,
)

REPO = Path(__file__).resolve().parents[1]

#: the shared options of every benchmark: the docs, benchmarks/gpu_bench.sh and the smoke
#: tests call them with these
SHARED = {
    "bench_attention": {"--smoke", "--device", "--threads", "--json"},
    "bench_theorem1": {"--smoke", "--device", "--json"},
    "bench_lrc": {"--smoke", "--device", "--threads", "--json"},
    "bench_vision": {"--smoke", "--device", "--threads", "--json"},
    "bench_compile": {"--smoke", "--device", "--threads", "--json"},
    "bench_onnx": {"--smoke", "--threads", "--json"},
    "bench_vision_deploy": {"--smoke", "--threads", "--json"},
    "bench_cifar_input": {"--smoke", "--threads", "--json"},
    "bench_cifar_depth": {"--threads"},
    "bench_nmt": {"--smoke", "--device", "--threads", "--json"},
    "bench_fairseq_cli": {"--smoke", "--json"},
    "bench_cpu_bf16": {"--smoke", "--threads", "--json"},
    "bench_deploy": {"--json"},
    "bench_ct2_sret": {"--smoke", "--threads", "--json"},
    "bench_hf": {"--threads", "--json"},
    "bench_depth": {"--smoke", "--device", "--threads", "--json"},
    "bench_uptrain": {"--smoke", "--json"},
    "bench_import": {"--json"},
    "count_ops": {"--smoke", "--json"},
    "flops_per_token": {"--json"},
    "deep_recursion": {"--threads", "--json"},
    "gpu_checks": {"--device", "--json"},
    "quickstart_budget": set(),
}
#: each shared option: what the command line gives, and the value the script reads
GIVEN = {"--smoke": ([], True), "--device": (["cpu"], "cpu"), "--threads": ([str(os.cpu_count())], os.cpu_count()),
         "--json": (["r.json"], "r.json")}


def benchmarks_command(*args, **kwargs):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, **kwargs)


def required_arguments(parser) -> list:
    """A placeholder for every argument the parser requires, so that it reaches the others."""
    given = []
    for action in parser._actions:
        if action.required:
            given += ["x"] if not action.option_strings else [action.option_strings[0], "x"]
    return given


def test_every_script_is_registered_and_every_registered_module_exists():
    scripts = {path.stem for path in (REPO / "benchmarks").glob("*.py")} - {"__init__", "__main__", "common"}
    assert set(BENCHMARKS) == scripts
    assert set(SHARED) == scripts
    for name, benchmark in BENCHMARKS.items():
        assert benchmark.module == f"benchmarks.{name}" and importlib.util.find_spec(benchmark.module) is not None
        assert benchmark.summary and "\n" not in benchmark.summary


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_each_benchmark_parser_takes_its_shared_options(name):
    try:
        module = importlib.import_module(BENCHMARKS[name].module)
    except ModuleNotFoundError as exc:  # bench_nmt imports fairseq at import time
        pytest.skip(f"{name}: {exc}")
    parser = module.build_parser()
    assert isinstance(parser, BenchmarkParser), f"{name}: its parser is not benchmark_parser's"
    assert set(parser.shared_options) == SHARED[name]
    base = required_arguments(parser)
    defaults = parser.parse_args(base)
    for option, (values, expected) in GIVEN.items():
        dest = option.lstrip("-")
        if option in parser.shared_options:
            assert getattr(parser.parse_args([*base, option, *values]), dest) == expected, (name, option)
        else:  # left out: neither read under the shared name nor declared again by the script
            assert not hasattr(defaults, dest), (name, option)


def test_the_parser_leaves_out_what_a_script_does_not_take(capsys):
    bare = benchmark_parser("bare", smoke=False, device=False, threads=False, json=False)
    assert bare.shared_options == ()
    for option, (values, _) in GIVEN.items():
        with pytest.raises(SystemExit):
            bare.parse_args([option, *values])
    assert "unrecognized arguments" in capsys.readouterr().err
    full = benchmark_parser("full", smoke="what it shrinks")
    assert vars(full.parse_args([])) == {"smoke": False, "device": "auto", "threads": None, "json": None, "force": False}
    full.set_defaults(device="cpu", threads=1)
    assert (full.parse_args([]).device, full.parse_args([]).threads) == ("cpu", 1)
    assert "what it shrinks" in full.format_help()


def test_json_report_holds_the_tables_and_only_json(tmp_path, capsys):
    args = benchmark_parser("t").parse_args(["--device", "cpu", "--json", str(tmp_path / "r.json")])
    assert start_benchmark(args).type == "cpu"
    print_table("a table", ["model", "speed"], [["ours", 1.5]])
    finish_benchmark(args, ratio=float("nan"))
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    # the stored fields are the values, the printed lines label them
    assert out.startswith(f"command: {report['command']}\nhardware: {report['hardware']}\n")
    assert report["hardware"].startswith("device: CPU")
    assert report["tables"] == [{"title": "a table", "headers": ["model", "speed"], "rows": [["ours", "1.5"]]}]
    assert report["ratio"] is None


def test_list_names_every_benchmark():
    for args in (["--list"], []):
        proc = benchmarks_command(*args)
        assert proc.returncode == 0 and proc.stderr == ""
        lines = proc.stdout.splitlines()
        for name, benchmark in BENCHMARKS.items():
            assert [line for line in lines if line.split()[:1] == [name] and line.endswith(benchmark.summary)], name


def test_an_unknown_name_is_one_line_of_error():
    proc = benchmarks_command("bench_atention")
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line == ("python -m benchmarks: error: unknown benchmark 'bench_atention'; did you mean bench_attention?"
                    " --list names them")
    assert main(["no_such_benchmark"]) == 2


@pytest.mark.e2e
def test_a_benchmark_runs_by_name_as_its_module_does(tmp_path):
    report = tmp_path / "theorem1.json"
    proc = benchmarks_command("bench_theorem1", "--smoke", "--skip-sret", "--json", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"command: python -m benchmarks.bench_theorem1 --smoke --skip-sret --json {report}\n")
    saved = json.loads(report.read_text())
    assert saved["command"] == f"python -m benchmarks.bench_theorem1 --smoke --skip-sret --json {report}"
    assert saved["hardware"].startswith("device: CPU") and f"hardware: {saved['hardware']}\n" in proc.stdout
    (table,) = saved["tables"]
    assert f"### {table['title']}" in proc.stdout and table["rows"]
    assert all(f"| {' | '.join(row)} |" in proc.stdout for row in table["rows"])
    failed = benchmarks_command("bench_theorem1", "--no-such-option")
    assert failed.returncode == 2 and "python -m benchmarks.bench_theorem1: error: unrecognized arguments" in failed.stderr


@pytest.mark.parametrize("args, error", [
    (["--threads", "0"], "argument --threads: must be at least 1, got 0"),
    (["--threads", "-1"], "argument --threads: must be at least 1, got -1"),
    (["--threads", "two"], "argument --threads: not an integer: 'two'"),
    (["--device", "gpu"], "argument --device: 'gpu' is not a device"),
    (["--json", "{missing}/report.json"], "argument --json: {missing}: no such folder"),
    (["--json", "{folder}"], "argument --json: {folder} is a folder"),
])
@pytest.mark.reliability("one-line-errors")
def test_shared_options_refuse_bad_values_before_anything_runs(args, error, tmp_path, capsys):
    """A value the benchmark cannot use is one argparse error at the start, not a traceback,
    nor (for --json) an error after the whole measurement, when its results would be lost."""
    names = {"missing": str(tmp_path / "missing"), "folder": str(tmp_path)}
    parser = benchmark_parser("test")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args([arg.format(**names) for arg in args])
    assert exit_info.value.code == 2
    assert error.format(**names) in capsys.readouterr().err


#: values each checked numeric type refuses (tests below); a bare int or float refuses none of them
REFUSED = {
    "positive_int": ["0", "-4", "2.5", "x"], "non_negative_int": ["-4", "2.5"], "thread_count": ["0", str(10**9)],
    "positive_float": ["0", "-1", "nan", "inf"], "non_negative_float": ["-1", "nan"], "finite_float": ["nan", "x"],
}


def option_values(action, value):
    return [value] * (action.nargs if isinstance(action.nargs, int) else 1)


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
@pytest.mark.reliability("one-line-errors")
def test_every_numeric_option_of_every_benchmark_refuses_what_it_cannot_use(name, capsys):
    """Every count, size, rate or time a benchmark takes has one of the checked types of
    benchmarks/common.py (never a bare int or float, which takes 0, -4, nan or a thread count
    no machine has), and a value it cannot use is one line naming the benchmark and the option,
    exit 2, when the command line is read: before anything runs."""
    from benchmarks import common

    try:
        module = importlib.import_module(BENCHMARKS[name].module)
    except ModuleNotFoundError as exc:
        pytest.skip(f"{name}: {exc}")
    parser = module.build_parser()
    base = required_arguments(parser)
    checked = {getattr(common, type_name, type_name): values for type_name, values in REFUSED.items()}
    for action in parser._actions:
        if not action.option_strings:
            continue
        option = action.option_strings[-1]
        assert action.type not in (int, float), f"{name} {option}: a bare {action.type.__name__}, no range checked"
        for value in checked.get(action.type, ()):
            with pytest.raises(SystemExit) as exit_info:
                parser.parse_args([*base, option, *option_values(action, value)])
            line = capsys.readouterr().err.strip().splitlines()[-1]
            assert exit_info.value.code == 2, (name, option, value)
            assert line.startswith(f"python -m benchmarks.{name}: error: argument ") and option in line, line


@pytest.mark.parametrize("name, args, error", [
    ("bench_attention", ["--heads", "3"], "--heads 3 must divide --embed-dim 512"),
    ("bench_attention", ["--lengths", "128", "512", "--groups", "1", "3"],
     "--groups 3 divides none of the sequence lengths (--lengths 128 512)"),
    ("bench_attention", ["--one-kernel-groups", "1024"], "--one-kernel-groups 1024 is longer than every"),
    ("bench_theorem1", ["--groups", "1", "3"], "--groups 3 divides none of the sequence lengths (--length 1024)"),
    ("bench_theorem1", ["--embed-dim", "100", "--heads", "8"], "--heads 8 must divide --embed-dim 100"),
    ("bench_theorem1", ["--device", "meta"], "argument --device: 'meta' is not a device"),
    ("gpu_checks", ["--width", "193"], "3 heads (width // 64) must divide --width 193"),
    ("deep_recursion", ["--width", "193"], "3 heads (width // 64) must divide --width 193"),
])
@pytest.mark.reliability("one-line-errors")
def test_options_that_do_not_fit_together_are_refused_when_read(name, args, error, capsys):
    parser = importlib.import_module(BENCHMARKS[name].module).build_parser()
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args([*required_arguments(parser), *args])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and line.startswith(f"python -m benchmarks.{name}: error: ") and error in line, line


@pytest.mark.e2e
@pytest.mark.parametrize("args", [
    ["bench_attention", "--rounds", "0"], ["bench_lrc", "--batch", "-4"], ["bench_import", "--repeats", "0"],
    ["bench_theorem1", "--heads", "0"], ["bench_attention", "--groups", "0"], ["bench_lrc", "--device", "meta"],
    ["bench_lrc", "--threads", str(10**6)],
])
def test_a_bad_option_ends_a_benchmark_before_it_prints_anything(args):
    proc = benchmarks_command(*args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout[-500:]
    (line,) = [line for line in proc.stderr.strip().splitlines() if not line.startswith(("usage:", " "))]
    assert line.startswith(f"python -m benchmarks.{args[0]}: error: argument {args[1]}"), line
