"""The benchmarks run end to end in their tiny --smoke settings.

Harness correctness only: exit status 0 and the expected table rows; no timing assertions.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
HAVE_FAIRSEQ = importlib.util.find_spec("fairseq") is not None


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run_script(name, *args, timeout=120, smoke=True):
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", *(["--smoke"] if smoke else []), *args], cwd=REPO, env=_env(),
        capture_output=True, text=True, timeout=timeout,
    )
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def rows(text, first_cell):
    """Markdown table rows whose first cell is ``first_cell``."""
    return [line for line in text.splitlines() if re.match(rf"\|\s*{re.escape(first_cell)}\s*\|", line)]


def test_bench_attention_smoke():
    out = run_script("bench_attention", "--device", "cpu")
    assert out.startswith("command: ") and "\nhardware: device: CPU" in out
    assert "### attention: G scaling" in out and "### attention: G=1 parity" in out
    for length in (16, 32):
        scaling = [r for r in rows(out, str(length)) if r.count("|") == 12]
        assert len(scaling) == 3, out  # G = 1, 2, 4
        assert all(re.search(r"\| \d+\.\d\dx \|", row) for row in scaling[1:]), out  # G = 2, 4 against G = 1
    ours = [line for line in out.splitlines() if "ours (G=1)" in line]
    assert len(ours) == 2 and all(re.search(r"\| \d+\.\d\dx \|", line) for line in ours), out


def test_bench_theorem1_smoke():
    out = run_script("bench_theorem1")
    assert "Theorem 1 check: holds exactly" in out
    for n, g in ((1, 1), (1, 2), (2, 1), (2, 2)):
        row = [r for r in rows(out, str(n)) if re.match(rf"\| {n} \| {g} \|", r)]
        assert row and "| 1.0000 |" in row[0], out
    stage = rows(out, "1")[-1]
    assert "| 0.3125 | 0.3125 |" in stage, out  # SReT-T stage 1: groups 8, 2 -> (1/8 + 1/2) / 2


def _timm_importable() -> bool:
    """As bench_vision judges it: timm installed beside a torchvision of another torch build
    (the package index's CUDA builds beside a CPU-only torch) fails to import."""
    try:
        import timm  # noqa: F401
        return True
    except Exception:
        return False


def test_bench_vision_smoke():
    out = run_script("bench_vision")
    assert "### vision inference" in out and "### vision training step" in out
    ours = rows(out, "SReT-T")
    assert len(ours) == 4, out  # eager + cl, inference and training
    assert all(re.search(r"\| \d[\d,.]* \|", r) for r in ours), out  # images/s filled in
    if not _timm_importable():
        assert "timm not installed: skipping deit_tiny_patch16_224" in out
    else:
        assert len(rows(out, "DeiT-T")) >= 2


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_bench_nmt_smoke():
    out = run_script("bench_nmt")
    assert "### NMT training" in out and "### NMT generation" in out
    for name in ("fairseq transformer", "sret", "sret, no NLL"):
        assert len(rows(out, name)) == 2, out
    assert all(len(re.findall(r"\| \d+\.\d\dx (?=\|)", r)) == 2 for r in rows(out, "sret")), out
    assert "target check (train)" in out and "target check (generate)" in out


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_bench_nmt_compiled_decoder_smoke():
    # the tiny architectures (two decoder layers each) take the same compile paths as the
    # default six, in much less compile time; test_bench_nmt_smoke has the training rows
    out = run_script("bench_nmt", "--compile-decoder", "--no-memory", "--skip-train", "--fairseq-arch",
                     "transformer_tiny", "--sret-arch", "sret_transformer_tiny", timeout=600)
    for name in ("fairseq transformer, compiled decoder layers", "sret, compiled decoder layers"):
        assert len(rows(out, name)) == 1, out  # generation only
        (line,) = [line for line in out.splitlines() if line.startswith(f"{name}: first batch ")]
        assert line.endswith("hypotheses identical to the eager model's"), line


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_bench_nmt_half_precision_generation_with_sdpa_decoding_row_smoke():
    out = run_script("bench_nmt", "--skip-train", "--gen-dtype", "bfloat16", "--sdpa-decoding", "--no-memory")
    assert "### NMT training" not in out and "### NMT generation (cpu, bfloat16)" in out
    for name in ("fairseq transformer", "sret", "sret, no NLL", "sret, SDPA decoding"):
        assert len(rows(out, name)) == 1, out


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_bench_depth_smoke(tmp_path):
    figure, table_file = tmp_path / "frontier.png", tmp_path / "frontier.json"
    out = run_script("bench_depth", "--figure", str(figure), "--json", str(table_file))
    assert "### decoding at every depth: beam 5" in out
    table = rows(out, "ckpt/checkpoint_last.pt")
    assert [r.split("|")[2].strip() for r in table] == ["1/1", "2/2"], out
    assert all("| 2/2 | 20 |" in r for r in table)  # trained with 2+2 recursions, 20 test sentences
    assert all(len(r.split("|")) == 10 for r in table)
    assert re.search(r"\| \d+\.\d\dx \|", table[0]), out  # depth 1 against the full depth
    assert all(re.search(r"\| \d+\.\d\d \|$", r) for r in table)  # a BLEU per depth
    baseline = rows(out, "transformer/checkpoint_last.pt")  # fairseq's transformer: as trained
    assert len(baseline) == 1 and "| as trained | – | 20 |" in baseline[0], out
    saved = json.loads(table_file.read_text())
    assert [(r["checkpoint"], r["depth"]) for r in saved["rows"]] == [
        ("ckpt/checkpoint_last.pt", [1, 1]), ("ckpt/checkpoint_last.pt", [2, 2]),
        ("transformer/checkpoint_last.pt", None)]
    assert saved["hardware"].startswith("device: ") and saved["command"].startswith("python -m benchmarks.bench_depth ")
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    foreign = tmp_path / "mine.json"
    foreign.write_text("a user's file")
    refused = subprocess.run([sys.executable, "-m", "benchmarks.bench_depth", "--smoke", "--json", str(foreign)],
                             cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "not made by bench_depth" in refused.stderr
    assert foreign.read_text() == "a user's file"
    redrawn = tmp_path / "redrawn.png"
    out = run_script("bench_depth", "--from-json", str(table_file), "--figure", str(redrawn), smoke=False)
    assert rows(out, "ckpt/checkpoint_last.pt") == table and redrawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    not_rows = subprocess.run([sys.executable, "-m", "benchmarks.bench_depth", "--from-json", str(foreign),
                               "--figure", str(tmp_path / "other.png")],
                              cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert not_rows.returncode == 2 and "not the rows of a --json run" in not_rows.stderr
    assert not (tmp_path / "other.png").exists()


def test_frontier_zooms_on_the_models_near_the_best():
    """A depth not trained for (BLEU 9) goes to the overview; the converged models keep an axis."""
    from benchmarks.bench_depth import zoom_split

    rows = [{"bleu": b, "name": n} for n, b in (("sret", 39.7), ("sret@1", 9.3), ("t2", 41.1), ("mixed@1", 40.7))]
    near, below = zoom_split(rows)
    assert [r["name"] for r in near] == ["sret", "t2", "mixed@1"] and [r["name"] for r in below] == ["sret@1"]
    assert zoom_split(rows[2:]) == (rows[2:], [])


def test_frontier_labels_do_not_cover_each_other():
    """Points a few pixels apart (the Multi30k frontier's transformers): every label readable."""
    from matplotlib.text import Text

    from benchmarks.bench_depth import place_labels
    from fairseq_sret_cli import pyplot

    plt = pyplot()
    fig, axis = plt.subplots(figsize=(8, 5.2))
    points = [(46.0, 39.7), (56.6, 41.5), (57.1, 40.9), (63.3, 41.1), (50.0, 41.3), (8.9, 9.3)]
    axis.scatter(*zip(*points))
    axis.margins(x=0.3, y=0.1)
    place_labels(fig, axis, [(f"transformer {i}+{i} post-LN", xy) for i, xy in enumerate(points)])
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(label, renderer) for label in axis.texts]  # the texts, not their lines
    plt.close(fig)
    assert len(boxes) == len(points)
    assert not [(i, j) for i in range(len(boxes)) for j in range(i) if boxes[i].overlaps(boxes[j])]


def test_gpu_bench_script_dry_run(tmp_path):
    """benchmarks/gpu_bench.sh in its CPU dry-run mode writes its logs under $OUT."""
    env = dict(_env(), SMOKE="1", OUT=str(tmp_path), PYTHON=sys.executable, GPU_BENCH_STEPS="attention")
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_bench.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.txt").read_text()
    assert "== attention" in summary and "rc=0" in summary and "done in" in summary
    assert "### attention: G scaling" in (tmp_path / "attention.txt").read_text()
    assert summary.startswith("date: ")
    assert len(list(tmp_path.iterdir())) <= 8


def test_bench_vision_variants_and_fold_smoke():
    out = run_script("bench_vision", "--models", "sret_t:3op,nofuse,eager,fold", "--modes", "infer")
    variants = [r.split("|")[2].strip() for r in rows(out, "SReT-T")]
    assert variants == ["3op", "nofuse", "eager", "fold"], out


def test_bench_vision_model_dtype_smoke():
    out = run_script("bench_vision", "--models", "sret_t:eager,fold", "--modes", "infer", "--model-dtype", "bfloat16")
    assert "(cpu, bfloat16 weights, 64x64, batch 2)" in out, out
    assert [r.split("|")[2].strip() for r in rows(out, "SReT-T")] == ["eager", "fold"], out


def test_bench_vision_model_dtype_is_for_inference_without_autocast():
    from benchmarks.bench_vision import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--model-dtype", "bfloat16"])  # training not excluded
    with pytest.raises(SystemExit):
        parse_args(["--model-dtype", "bfloat16", "--modes", "infer", "--dtype", "bfloat16"])
    assert parse_args(["--model-dtype", "bfloat16", "--modes", "infer"]).model_dtype == "bfloat16"


def test_bench_vision_variant_names():
    from benchmarks.bench_vision import hardware_variant, variant_tokens

    assert variant_tokens("eager") == set() and variant_tokens("fold+graph") == {"fold", "graph"}
    assert hardware_variant("fold+compile") == "compile" and hardware_variant("3op") == "eager"
    assert hardware_variant("stembn") == "eager"
    assert hardware_variant("triton+graph") == "graph" and variant_tokens("nofuse+graph") == {"nofuse", "graph"}
    with pytest.raises(ValueError, match="unknown variant"):
        variant_tokens("fast")


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_bench_fairseq_cli_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_fairseq_cli", "--smoke", "--work", str(tmp_path), "--sdpa-decoding"],
        cwd=REPO,
        env=_env(), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "### fairseq-train / fairseq-generate (cpu)" in out
    for arch in ("sret_transformer_tiny", "transformer"):
        row = rows(out, arch)
        assert len(row) == 1 and "n/a" not in row[0].split("|")[3] and "n/a" not in row[0].split("|")[5], out
        # the one-batch valid split, generated in a process of its own for the rate after the first batch
        assert re.search(rf"generate {arch} fp32 valid: rc=0 \d+ s, 8 sentences", out), out
        assert re.search(rf"generate {arch} fp32 test: rc=0 \d+ s, 16 sentences", out), out
    # SReT's checkpoint once more, its decoding steps attending through SDPA: a row of its own
    row = rows(out, "sret_transformer_tiny, SDPA decoding")
    assert len(row) == 1 and "n/a" not in row[0].split("|")[5], out
    assert not rows(out, "transformer, SDPA decoding")


def test_bench_fairseq_cli_replaces_only_its_own_work(tmp_path, capsys):
    """--work: what the benchmark would replace there must be its own, else it stops before
    running anything (exit 2, the user's files intact) unless --force; its own data-bin is
    reused only with the same data settings."""
    from benchmarks import bench_fairseq_cli as bench
    from fairseq_sret_cli.outputs import OutputInTheWay

    work = tmp_path / "work"
    (work / "bin").mkdir(parents=True)
    (work / "bin" / "notes.txt").write_text("mine")
    (work / "results.json").write_text("{}")
    assert bench.main(["--smoke", "--work", str(work)]) == 2
    err = capsys.readouterr().err
    assert "work/bin and 1 more: exists, not made by bench_fairseq_cli" in err and "--force" in err  # + results.json
    assert (work / "bin" / "notes.txt").read_text() == "mine" and (work / "results.json").read_text() == "{}"
    bench.claim_work(bench.parse_args(["--smoke", "--work", str(work), "--force"]), work)  # allowed

    own = tmp_path / "own"
    args = bench.parse_args(["--smoke", "--work", str(own)])
    data, _ = bench.claim_work(args, own)
    (own / "bin").mkdir(parents=True)
    data.record(own / "bin")
    data, _ = bench.claim_work(args, own)
    assert data.made_by_me(own / "bin")
    args.vocab += 1  # other data settings: its own folder, replaced rather than reused
    data, _ = bench.claim_work(args, own)
    assert not data.made_by_me(own / "bin")
    (own / "train_transformer_fp32.log").write_text("a user's log")
    with pytest.raises(OutputInTheWay, match="train_transformer_fp32.log"):
        bench.claim_work(args, own)


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_bench_uptrain_smoke(tmp_path):
    out = run_script("bench_uptrain", "--work-dir", str(tmp_path), timeout=600)
    assert out.startswith("command: ") and "\nhardware: device: CPU" in out
    assert "0+1 -> 0, 2+3 -> 1" in out and "converted model before fine-tuning: valid loss" in out
    for run in ("teacher: transformer 4+4 pre-LN", "uptrained 2x2: the teacher's best checkpoint converted, then fine-tuned",
                "scratch 2x2: random init"):  # (no long from-scratch run in --smoke)
        assert len(rows(out, run)) == 1, out


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_bench_cpu_bf16_smoke():
    from fairseq_sret.fairseq_patches import cpu_has_native_bf16

    if not cpu_has_native_bf16():  # bf16 would be emulated: the benchmark says so and measures nothing
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_cpu_bf16", "--smoke"], cwd=REPO, env=_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("python -m benchmarks.bench_cpu_bf16: error: --bf16 on the CPU") and "native bf16" in last
        assert "bf16/fp32 per round:" not in proc.stdout
        return
    out = run_script("bench_cpu_bf16")
    assert out.startswith("command: ") and "\nhardware: device: CPU" in out
    assert len(rows(out, "fp32")) == len(rows(out, "bf16")) == 2, out  # decoding and training
    assert out.count("bf16/fp32 per round:") == 2
    if importlib.util.find_spec("torchao") is not None:  # int8 decodes; it does not train
        out = run_script("bench_cpu_bf16", "--int8", "--skip-train")
        assert len(rows(out, "fp32")) == len(rows(out, "bf16")) == len(rows(out, "int8")) == 1, out
        assert out.count("int8/fp32 per round:") == 1


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnxscript") is None,
                    reason="ONNX export needs onnxscript and onnxruntime (pip install -e '.[onnx]')")
def test_bench_onnx_smoke():
    out = run_script("bench_onnx", timeout=600)
    assert "### ONNX export" in out and len(rows(out, "sret_t")) == 1 and len(rows(out, "sret_s")) == 1


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("timm") is None,
                    reason="needs onnxruntime and timm (pip install -e '.[onnx,timm]')")
def test_bench_vision_deploy_smoke(tmp_path):
    """Every model through every engine, and ONNX Runtime's fp32 logits those of PyTorch (the
    LRC folded and the stem's BatchNorm folded before the export)."""
    out = run_script("bench_vision_deploy", "--json", str(tmp_path / "deploy.json"), timeout=600)
    report = json.loads((tmp_path / "deploy.json").read_text())
    rows_ = {row[0] for table in report["tables"] for row in table["rows"]}
    assert rows_ == {f"{m}/{e}" for m in ("sret_t", "deit_tiny_patch16_224")
                     for e in ("pytorch/fp32", "onnxruntime/fp32", "onnxruntime/int8")}, out
    assert report["errors"]["sret_t/onnxruntime/fp32"] < 1e-4
    assert report["errors"]["deit_tiny_patch16_224/onnxruntime/fp32"] < 1e-4


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq not installed")
def test_count_ops_smoke():
    out = run_script("count_ops")
    assert rows(out, "sret_t")
    encoder_kib = {}
    for model in ("SReT tiny 2x2", "transformer 4+4 post-LN"):
        ops, cache = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows(out, model)]
        _, decoder_step, _, beam_step, _, host_reads = ops
        # a beam-search step is the decoder step plus the output layer, the search and the
        # cache reordering, and it reads at least the search's results on the host
        assert int(beam_step) > int(decoder_step) > 0 and int(host_reads) > 0, ops
        _, total_kib, _, encoder_kib[model], _ = cache
        assert float(total_kib) > float(encoder_kib[model]) > 0, cache
    # SReT's 4 decoder applications share 2 caches of the encoder's keys and values; the 4+4
    # transformer keeps 4 (padding masks aside, which both keep too)
    assert 2 * float(encoder_kib["SReT tiny 2x2"]) <= float(encoder_kib["transformer 4+4 post-LN"])


@pytest.mark.skipif(not _timm_importable(), reason="bench_compile builds timm's DeiT-T beside ours")
def test_bench_compile_smoke():
    out = run_script("bench_compile", "--regional", timeout=300)
    assert len(rows(out, "sret_t")) == 2 + 2 * 2, out  # two ways compiled; two depths each after the first call
    assert rows(out, "deit_tiny_patch16_224"), out


def test_bench_cifar_input_times_every_part_of_an_epoch():
    pytest.importorskip("timm")
    out = run_script("bench_cifar_input", timeout=300)
    assert len(rows(out, "decoding train + test once")) == 1 and len(rows(out, "input pipeline")) == 1
    models = [line for line in out.splitlines() if line.startswith("| training update, ")]
    assert [m.split("`")[1] for m in models] == ["sret_cifar_baseline", "sret_cifar_baseline_deep",
                                                "sret_cifar_wo_slice", "sret_cifar"]
    assert "hardware: device: CPU" in out and "command: python -m benchmarks.bench_cifar_input --smoke" in out


def test_bench_cifar_depth_places_every_depth_of_the_finished_runs(tmp_path):
    pytest.importorskip("timm")
    from benchmarks.bench_cifar_input import tiny_image_folder
    from fairseq_sret_cli import experiments

    data = tiny_image_folder(tmp_path / "data")
    fast = ("--epochs 1 --batch-size 4 --val-split 4 --max-steps-per-epoch 1 --log-interval 0 --threads 1"
            " --eval-batch-size 20")
    table_rows = [{"id": "baseline", "title": "baseline", "model": "sret_cifar_baseline"},
                  {"id": "sret", "title": "SReT", "model": "sret_cifar", "args": "--mixed-depth 1:0.5"},
                  {"id": "sret_full_depth", "title": "SReT at full depth", "model": "sret_cifar"},
                  {"id": "later", "title": "not trained", "model": "sret_cifar_wo_slice"}]
    path = tmp_path / "exp.yaml"
    path.write_text(json.dumps({"kind": "vision", "name": "tiny", "seeds": [1], "train": {"args": fast},
                                "rows": table_rows}))
    common = ["--data", str(data), "--output", str(tmp_path / "runs")]
    assert experiments.main([str(path), *common, "--rows", "baseline", "sret", "sret_full_depth",
                             "--results", str(tmp_path)]) == 0
    out = run_script("bench_cifar_depth", str(path), *common, "--out", str(tmp_path / "depth.png"),
                     "--batch-size", "4", "--rounds", "3", smoke=False, timeout=300)
    assert len(rows(out, "baseline")) == 1 and len(rows(out, "SReT")) == 2  # depths 2 and 1
    assert "missing" in rows(out, "not trained")[0]
    points = json.loads((tmp_path / "depth.json").read_text())["points"]
    assert sorted((p["row"], p["depth"]) for p in points) == [
        ("baseline", 1), ("sret", 1), ("sret", 2), ("sret_full_depth", 1), ("sret_full_depth", 2)]
    # rows that differ in training only are one model: one measurement, not two that drift apart
    speed = {(p["row"], p["depth"]): p["images_per_cpu_s"] for p in points}
    assert speed["sret", 1] == speed["sret_full_depth", 1] and speed["sret", 2] == speed["sret_full_depth", 2]
    assert speed["sret", 1] != speed["sret", 2]
    # the median lies within the range of the turns, both given in the table
    assert all(p["images_per_cpu_s_range"][0] <= p["images_per_cpu_s"] <= p["images_per_cpu_s_range"][1]
               for p in points)
    assert "median (range) of 3" in out and "-" in rows(out, "baseline")[0].split("|")[4]
    assert (tmp_path / "depth.png").read_bytes()[:4] == b"\x89PNG"
    # on a machine without the run folders, the runs the results file records are drawn
    out = run_script("bench_cifar_depth", str(path), "--data", str(data), "--output", str(tmp_path / "elsewhere"),
                     "--results", str(tmp_path), "--out", str(tmp_path / "clone.png"), "--batch-size", "4",
                     "--rounds", "1", smoke=False, timeout=300)
    assert len(rows(out, "baseline")) == 1 and len(rows(out, "SReT")) == 2, out
    clone = json.loads((tmp_path / "clone.json").read_text())["points"]
    assert [(p["row"], p["depth"], p["top1"]) for p in clone] == [(p["row"], p["depth"], p["top1"]) for p in points]


@pytest.mark.skipif(not HAVE_FAIRSEQ, reason="fairseq is not installed")
def test_bench_deploy_smoke(tmp_path):
    """Every row translates the same sentences and is scored; the transformer in CTranslate2
    (fp32, where ctranslate2 is installed) is fairseq's model, so its BLEU is fairseq's; SReT
    with sliced attention is not measured in CTranslate2, with the reason."""
    pytest.importorskip("torchao")
    from cli_helpers import ENV, SRET, TRAIN, USER_DIR, command
    from fairseq_sret_cli.data import multi30k

    raw = tmp_path / "raw"
    raw.mkdir()
    words = [("Hund", "dog"), ("Katze", "cat"), ("Mann", "man"), ("Frau", "woman"), ("läuft", "runs"), ("rot", "red")]
    for split, size in (("train", 200), ("val", 10), ("test_2016_flickr", 12)):
        pairs = [[words[(i * 7 + k * 3) % 6] for k in range(2 + i % 4)] for i in range(size)]
        (raw / f"{split}.de").write_text("".join(" ".join(d for d, _ in p) + ".\n" for p in pairs), encoding="utf-8")
        (raw / f"{split}.en").write_text("".join(" ".join(e for _, e in p) + ".\n" for p in pairs), encoding="utf-8")
    data_bin = multi30k.prepare(tmp_path / "bin", src=raw, vocab_size=40)
    transformer = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", *SRET[4:12],
                   "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]
    for name, model in (("sret", SRET), ("transformer", [*USER_DIR, *transformer])):
        subprocess.run(command("fairseq-train", data_bin, *model, *TRAIN, "--max-update", "3", "--save-dir",
                               tmp_path / name), env=ENV, check=True, capture_output=True, timeout=300)
    ct2 = importlib.util.find_spec("ctranslate2") is not None
    out = run_script("bench_deploy", "--data-bin", str(data_bin), "--sret", str(tmp_path / "sret" / "checkpoint_last.pt"),
                     "--transformer", str(tmp_path / "transformer" / "checkpoint_last.pt"), "--limit", "8",
                     "--rows", "sret/fairseq/fp32", "sret/fairseq/int8", "transformer/fairseq/fp32",
                     *(["transformer/ctranslate2/fp32", "sret/ctranslate2/fp32"] if ct2 else []), "--repeats", "2",
                     "--json", str(tmp_path / "deploy.json"), smoke=False, timeout=600)
    results = {r["row"]: r for r in json.loads((tmp_path / "deploy.json").read_text())["rows"]}
    assert set(results) == {"sret/fairseq/fp32", "sret/fairseq/int8", "transformer/fairseq/fp32"} | (
        {"transformer/ctranslate2/fp32"} if ct2 else set())
    assert all(r["sentences"] == 8 and r["sentences_per_s"] > 0 and len(r["cpu_seconds"]) == 2
               and r["sentences_per_cpu_s_range"][0] <= r["sentences_per_cpu_s"] <= r["sentences_per_cpu_s_range"][1]
               for r in results.values())
    if ct2:
        converted = results["transformer/ctranslate2/fp32"]
        assert converted["bleu"] == results["transformer/fairseq/fp32"]["bleu"]
        assert converted["same_as_fairseq"] == 8 and converted["bleu_minus_fairseq"] == 0
        # this SReT slices its attention into 2 groups, which CTranslate2 cannot: the row says so
        assert "sret/ctranslate2/fp32: not measured: CTranslate2 cannot run this checkpoint: encoder layer 0," \
            " application 1: sliced group attention with 2 groups" in out


@pytest.mark.skipif(not HAVE_FAIRSEQ or importlib.util.find_spec("ctranslate2") is None,
                    reason="fairseq or ctranslate2 is not installed")
def test_bench_ct2_sret_smoke():
    """Both models are converted three ways, scored against fairseq, and every engine decodes."""
    out = run_script("bench_ct2_sret", timeout=300)
    for model in ("NLL ratio 0.5", "NLL ratio 0.0"):
        table = rows(out, model)
        assert len(table) == 4 + 4, out  # 3 exports and the checkpoint; 4 engines
        difference = [r for r in table if "| CTranslate2 fp32 |" in r and "e-" in r.split("|")[-2]]
        assert len(difference) == 1 and float(difference[0].split("|")[-2]) < 1e-3, out
        assert all(float(r.split("|")[3]) > 0 for r in table if r.rstrip().endswith("x |")), out
