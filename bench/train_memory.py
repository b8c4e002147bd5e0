"""What a training job holds at its peak: full fine-tuning in fp32, weights in bf16, LoRA.

    .venv/bin/python bench/train_memory.py                                   # the tests' tiny Qwen2, and a 20M one
    .venv/bin/python bench/train_memory.py --sizes 896x12 --device cuda --dtype bf16 --backends embedded trl

Each mode is one `evotrainer train` of a few steps of the reference recipe (64 prompts x 8)
on a Qwen2-architecture model built here from a config (random weights, a 400-token BPE;
HIDDENxLAYERS; nothing is downloaded), each in a fresh sandboxed worker as in a run. Read
from the job's own metrics (trainer/grpo.py peak_memory): its peak resident memory and, on
CUDA, its peak allocated GPU memory; beside them the trainable parameters, what a
checkpoint's weights take, and the wall time of the command (model load and evaluation
included). A process that imports torch and transformers is ~0.4 GB before any weight, so
the tiny model shows that floor and the larger one what the modes change.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tiny_hf import build_tiny_qwen  # noqa: E402

MODES = {
    "full, fp32 weights": [],
    "full, bf16 weights": ["--weights", "bf16"],
    "LoRA r16, fp32 base": ["--lora-rank", "16"],
    "LoRA r16, bf16 base": ["--lora-rank", "16", "--weights", "bf16"],
    "LoRA r16, bf16 base, checkpointing": ["--lora-rank", "16", "--weights", "bf16", "--gradient-checkpointing"],
}


def run_mode(model: Path, flags: list[str], backend: str, args, out: Path) -> dict:
    t = time.time()
    cmd = [sys.executable, "-m", "evotrainer.cli", "train", "--task", "arith", "--level", "1", "--model", str(model),
           "--backend", backend, "--device", args.device, "--dtype", args.dtype, "--steps", str(args.steps),
           "--eval-every", "0", "--out", str(out), "--timeout", str(args.timeout), *flags]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    seconds = time.time() - t
    if res.returncode != 0:
        return {"error": (res.stderr or res.stdout).strip().splitlines()[-1][:200] if (res.stderr or res.stdout) else
                f"exit {res.returncode}", "seconds": seconds}
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    run = json.loads((out / "run.json").read_text())
    weights = sum(f.stat().st_size for f in (out / "checkpoint").glob("*.safetensors"))
    return {"rss_mb": last["peak_rss_mb"], "gpu_mb": last["peak_gpu_mb"], "trainable": run["trainable_params"],
            "ckpt_mb": weights / 2 ** 20, "seconds": seconds, "reward": last["reward_mean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["64x2", "512x8"], help="HIDDENxLAYERS of the models (64x2: the tests')")
    ap.add_argument("--backends", nargs="+", default=["embedded"], choices=["embedded", "trl"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", help="autocast precision of the passes (bf16 on a GPU)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="train-memory-") as tmp:
        tmp = Path(tmp)
        tmp.chmod(0o755)  # sandboxed jobs run as nobody and read the model
        print(f"device {args.device}, dtype {args.dtype}, {args.steps} steps of 64 x 8 each\n")
        print("| model | backend | mode | trainable params | checkpoint MB | peak RSS MB | peak GPU MB | wall s |")
        print("|---|---|---|---|---|---|---|---|")
        for size in args.sizes:
            hidden, layers = map(int, size.split("x"))
            model = build_tiny_qwen(tmp / f"qwen-{size}", hidden=hidden, layers=layers)
            for p in [model, *model.iterdir()]:
                p.chmod(p.stat().st_mode | 0o055)
            for backend in args.backends:
                for i, mode in enumerate(args.modes):
                    r = run_mode(model, MODES[mode], backend, args, tmp / f"{size}-{backend}-{i}")
                    if "error" in r:
                        print(f"| {size} | {backend} | {mode} | failed: {r['error']} | | | | {r['seconds']:.0f} |", flush=True)
                        continue
                    print(f"| {size} | {backend} | {mode} | {r['trainable']:,} | {r['ckpt_mb']:.2f} | {r['rss_mb']:.0f} | "
                          f"{r['gpu_mb']:.0f} | {r['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
