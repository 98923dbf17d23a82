from setuptools import find_packages, setup

setup(
    name="fairseq-sret",
    version="0.1.0",
    description="Sliced Recursive Transformer (SReT, ECCV 2022) for fairseq NMT and vision",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["fairseq_sret", "fairseq_sret.*", "fairseq_sret_cli", "fairseq_sret_cli.*"]),
    # The floors are the versions a documented run has exercised: the whole test suite on
    # Python 3.11 with torch 2.13 (CPU), the GPU benchmarks on Python 3.12 with torch 2.11
    # (docs/benchmarks/README.md). The code needs torch >= 2.3 (torch.compiler.is_compiling,
    # torch.amp.GradScaler(device)); fairseq 0.12.2, the PyPI release for Python < 3.11,
    # has never been run with this package.
    python_requires=">=3.11",
    install_requires=[
        # Install torch before this package (scripts/setup_env.sh does): a bare torch
        # requirement resolved by pip can pull a multi-GB CUDA build.
        "torch>=2.11",
        "pyyaml",  # experiment files (sret-experiments)
    ],
    extras_require={
        # translation with fairseq: the plugin (--user-dir fairseq_sret), sret-prepare,
        # sret-evaluate, sret-uptrain. fairseq-fixed is fairseq's main branch with the
        # Python 3.11 fixes (the same `fairseq` module); it has wheels up to Python 3.12 and
        # builds from source on 3.13. The core, the vision models and the transformers
        # adapter never need it.
        "fairseq": ["fairseq-fixed==0.12.3.1", "sacrebleu>=2.0", "sentencepiece", "sacremoses"],
        # triton: the fused residual + LRC + LayerNorm kernel's tests run under Triton's
        # interpreter on CPU-only machines (~10 s). Capped below 3.9 because this project's
        # local package index carries 3.8.0, so a clean CI install takes it from there in
        # seconds instead of downloading 286 MB; the kernels work with 3.8 and 3.9 (both tested).
        # onnx...: the ONNX export tests (slow tier, about a minute of CPU) run in CI too
        # matplotlib: the experiment runner's plots are checked in CI
        # transformers, safetensors: the Hugging Face export's tests (fairseq_sret.hf)
        # ctranslate2: the CTranslate2 export's tests (sret-export-ct2)
        # pytest-xdist: scripts/run_tests.sh runs the suite on every core (--dist loadfile)
        "test": ["pytest", "pytest-xdist", "hypothesis", "pillow", "matplotlib", "onnx", "onnxscript", "onnxruntime",
                 "transformers>=5.24", "safetensors", "torchao>=0.15", "ctranslate2",
                 'triton>=3.0,<3.9; platform_system == "Linux" and platform_machine == "x86_64"'],
        # the optional Triton kernels (fairseq_sret.core.fused); CUDA machines with a CUDA
        # build of torch usually have triton already
        # int8 inference on the CPU (fairseq_sret.core.int8): torchao's dynamic int8, which
        # transformers' TorchAoConfig also loads
        "int8": ["torchao>=0.15"],
        "kernels": ['triton>=3.0; platform_system == "Linux"'],
        "plot": ["matplotlib"],
        # image loading for sret-train-vision (no torchvision needed)
        "vision": ["pillow"],
        # fairseq_sret.vision.export_onnx (torch's dynamo exporter) and its check with ONNX Runtime
        "onnx": ["onnx", "onnxscript", "onnxruntime"],
        # the vision models as timm models (importing fairseq_sret.vision registers them; docs/vision.md).
        # timm imports torchvision, which must be a build for the installed torch: the tested stack is
        # scripts/setup_env.sh's SRET_TIMM=1 (torch 2.14.1, torchvision 0.29.1, timm 1.0.31)
        "timm": ["timm>=1.0.31"],
        # timm's DeiT and PiT for benchmarks.bench_vision. timm imports torchvision, and the
        # package index's torchvision wheels are CUDA builds that fail to import beside a
        # CPU-only torch (torch 2.13.0+cpu here): on such a machine the comparison needs a
        # torch and torchvision of one build, e.g. torch==2.14.1 torchvision==0.29.1 in a
        # separate environment (a CUDA build of torch also runs on the CPU)
        "bench": ["timm"],
        # fairseq_sret.hf: the translation models as transformers encoder-decoders
        # (sret-export-hf; AutoModelForSeq2SeqLM after `import fairseq_sret.hf`). 5.24 is the
        # version tested; the models use its `cache` argument of generate()/forward.
        "hf": ["transformers>=5.24", "safetensors", "sentencepiece"],
        # sret-export-ct2: the translation models as CTranslate2 models (fairseq_sret.conversion.ctranslate2_spec),
        # which translate with ctranslate2 and sentencepiece alone
        "deploy": ["ctranslate2", "sentencepiece"],
    },
    entry_points={
        "console_scripts": [
            "sret-prepare = fairseq_sret_cli.prepare:main",
            "sret-evaluate = fairseq_sret_cli.evaluate:main",
            "sret-average-checkpoints = fairseq_sret_cli.average_checkpoints:main",
            "sret-plot-lrc = fairseq_sret_cli.plot_lrc:main",
            "sret-train-vision = fairseq_sret_cli.train_vision:main",
            "sret-train-cifar = fairseq_sret_cli.train_cifar:main",
            "sret-count = fairseq_sret_cli.count:main",
            "sret-toy-data = fairseq_sret_cli.toy:main",
            "sret-experiments = fairseq_sret_cli.experiments:main",
            "sret-uptrain = fairseq_sret_cli.uptrain:main",
            "sret-export-hf = fairseq_sret_cli.export_hf:main",
            "sret-export-ct2 = fairseq_sret_cli.export_ct2:main",
        ],
    },
    classifiers=[
        "License :: OSI Approved :: MIT License",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
