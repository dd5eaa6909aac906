#!/usr/bin/env python3
"""PyTorch's side of benches/train.rs (issue 31): time per training step of
the digits MLP (64-128-64-10) and SINGA's CNN (examples/nd_cnn.rs's), at
batch sizes 1, 64 and 256, in PyTorch's eager CPU mode, with the bench's
steps, warm-up, runs, optimizer (Adam, lr 3e-3), loss (softmax
cross-entropy, mean) and batches (the same digits in the same order).

    cargo bench --features nd --bench train -- --dump /tmp/digits.bin
    python3 benches/torch_train.py /tmp/digits.bin                 # threads 2
    python3 benches/torch_train.py /tmp/digits.bin --threads 2 1 --json out.json
    python3 benches/torch_train.py /tmp/digits.bin --quick

Which torch: the script first tries `import torch` in the interpreter that
runs it. If there is none, it makes a virtual environment (default
benches/.torch-venv, or --venv PATH), installs PyTorch's CPU-only wheel
into it (`pip install torch --index-url https://download.pytorch.org/whl/cpu`)
and runs itself again with the environment's python. `--venv PATH` asks for
that environment even when a torch is importable; when the install fails
(no network, index unreachable) the script says so and falls back to an
importable torch if there is one. It prints which torch it ran, from where,
its threads and `torch.__config__.show()`'s BLAS / oneDNN lines.

Method (as the bench's): per row a fresh model (seeded), Adam and input
tensors made outside the step, filled per step with `copy_`; WARMUP steps,
then RUNS runs of STEPS steps; each run's time / steps, the median over runs.
The loss is added into a loss-sum tensor per step and read once after the
runs (PyTorch eager's ops are synchronous, so no step is left in flight).
Each thread count runs in a process of its own (`torch.set_num_threads`).
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import time
import array

SEED = 13
LEARNING_RATE = 3e-3
CLASSES = 10
SIDE = 8
BATCHES = [1, 64, 256]
WARMUP = 5
MASK = (1 << 64) - 1
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
HERE = os.path.dirname(os.path.abspath(__file__))


def steps_for(batch, quick):
    """benches/train.rs's `steps_for`."""
    if quick:
        return 20 if batch == 1 else 3
    return {1: 200, 64: 50}.get(batch, 20)


class Rng:
    """splitmix64, as examples/data_parallel/data.rs."""

    def __init__(self, state):
        self.state = state & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def shuffle(self, v):
        for i in range(len(v) - 1, 0, -1):
            j = self.next() % (i + 1)
            v[i], v[j] = v[j], v[i]


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    n_train, n_test, features = struct.unpack_from("<3I", raw)
    values = array.array("f")
    values.frombytes(raw[12:])
    if sys.byteorder != "little":
        values.byteswap()
    sizes = [n_train * features, n_train, n_test * features, n_test]
    if sum(sizes) != len(values):
        sys.exit(f"{path}: {len(values)} values, expected {sum(sizes)}")
    return n_train, features, values[: sizes[0]], values[sizes[0] : sizes[0] + sizes[1]]


# --- finding torch -----------------------------------------------------------


def venv_python(venv):
    return os.path.join(venv, "bin", "python")


def install_cpu_torch(venv):
    """Makes `venv` with PyTorch's CPU wheel; returns its python, or None and why."""
    py = venv_python(venv)
    try:
        if not os.path.exists(py):
            print(f"torch_train: creating a virtual environment at {venv}", flush=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        probe = subprocess.run([py, "-c", "import torch"], capture_output=True)
        if probe.returncode == 0:
            return py, None
        print(f"torch_train: pip install torch --index-url {CPU_INDEX} (into {venv})", flush=True)
        out = subprocess.run(
            [py, "-m", "pip", "install", "--timeout", "20", "--retries", "1", "torch", "--index-url", CPU_INDEX],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
            return None, f"pip could not install torch from {CPU_INDEX}: " + " | ".join(tail)
        return py, None
    except (OSError, subprocess.CalledProcessError) as e:
        return None, f"could not make the virtual environment {venv}: {e}"


def ensure_torch(args):
    """Re-runs this script under a venv's python when asked or when torch is missing."""
    if os.environ.get("DEPFLOW_TORCH_CHILD"):
        return
    try:
        import torch  # noqa: F401

        have = True
    except ImportError:
        have = False
    if have and args.venv is None:
        return
    venv = args.venv or os.path.join(HERE, ".torch-venv")
    py, why = install_cpu_torch(venv)
    if py is None:
        print(f"torch_train: {why}", flush=True)
        if have:
            print(f"torch_train: falling back to the torch importable by {sys.executable}", flush=True)
            return
        sys.exit("torch_train: no torch: install one (see the module docs) and run again")
    if os.path.realpath(py) == os.path.realpath(sys.executable):
        return
    env = dict(os.environ, DEPFLOW_TORCH_CHILD="1")
    argv = [a for a in sys.argv[1:]]
    sys.exit(subprocess.run([py, os.path.abspath(__file__)] + argv, env=env).returncode)


def describe_torch():
    import torch

    config = torch.__config__.show()
    keep = [
        l.strip()
        for l in config.splitlines()
        if any(k in l for k in ("MKL", "oneDNN", "OpenMP", "LAPACK", "CPU capability")) and "Build settings" not in l
    ]
    # The BLAS / oneDNN libraries actually loaded (BLAS_INFO=generic means
    # whatever libblas.so.3 the system resolves).
    libs = set()
    try:
        with open("/proc/self/maps") as maps:
            for l in maps:
                path = l.split()[-1]
                if any(k in os.path.basename(path) for k in ("blas", "dnnl", "mkl", "lapack", "blis")):
                    libs.add(os.path.realpath(path))
    except OSError:
        pass
    blas = [k.split("=")[1] for k in config.replace(",", " ").split() if k.startswith("BLAS_INFO=")]
    return {
        "version": torch.__version__,
        "from": os.path.dirname(torch.__file__),
        "python": sys.executable,
        "blas_info": blas[0] if blas else "?",
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "config": keep,
        "libraries": sorted(libs),
    }


# --- the runs ------------------------------------------------------------------


def make_model(name):
    from torch import nn

    if name == "mlp":
        return nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, CLASSES)
        )
    return nn.Sequential(
        nn.Conv2d(1, 20, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(20, 50, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(50 * 2 * 2, 500),
        nn.ReLU(),
        nn.Linear(500, CLASSES),
    )


def feed(train_x, train_y, n_train, rows, count):
    """`count` batches of `rows` (index tensors), in the bench's order."""
    import torch

    per_epoch = n_train // rows
    out, order = [], None
    for k in range(count):
        epoch, b = divmod(k, per_epoch)
        if b == 0:
            order = list(range(n_train))
            Rng(SEED + 1 + epoch).shuffle(order)
        ids = torch.tensor(order[b * rows : (b + 1) * rows])
        out.append((train_x[ids], train_y[ids]))
    return out


def run_row(name, batch, steps, runs, data):
    import torch
    from torch import nn

    n_train, features, tx, ty = data
    torch.manual_seed(SEED)
    model = make_model(name)
    adam = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    shape = (batch, features) if name == "mlp" else (batch, 1, SIDE, SIDE)
    train_x = torch.tensor(tx, dtype=torch.float32).reshape((n_train,) + shape[1:])
    train_y = torch.tensor(ty, dtype=torch.float32).long()
    x = torch.empty(shape)
    y = torch.empty(batch, dtype=torch.long)
    loss_sum = torch.zeros(())
    batches = iter(feed(train_x, train_y, n_train, batch, WARMUP + runs * steps))

    def step():
        bx, by = next(batches)
        x.copy_(bx)
        y.copy_(by)
        adam.zero_grad()
        loss = loss_fn(model(x), y)
        loss_sum.add_(loss.detach())
        loss.backward()
        adam.step()

    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - start) / steps)
    total = loss_sum.item()
    if total != total or abs(total) == float("inf"):
        sys.exit(f"{name} batch {batch}: the loss sum is {total}")
    return times


def child(a):
    import torch

    torch.set_num_threads(a.threads[0])
    data = load(a.data)
    rows = []
    for name in a.models:
        for batch in a.batches:
            steps = steps_for(batch, a.quick)
            times = run_row(name, batch, steps, a.runs, data)
            med = sorted(times)[len(times) // 2]
            rows.append(
                {
                    "side": "pytorch",
                    "model": name,
                    "batch": batch,
                    "threads": a.threads[0],
                    "mode": "eager",
                    "steps": steps,
                    "ms_per_step": med * 1e3,
                    "runs_ms_per_step": [t * 1e3 for t in times],
                }
            )
    print("ROWS " + json.dumps({"torch": describe_torch(), "threads_now": torch.get_num_threads(), "rows": rows}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="the digits, written by `cargo bench --features nd --bench train -- --dump PATH`")
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    p.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="the bench's --quick steps, 2 runs at most")
    p.add_argument("--json", help="write the rows as JSON here")
    p.add_argument("--venv", help="use (make, install the CPU wheel into) this virtual environment")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.quick:
        a.runs = min(a.runs, 2)
    if a.child:
        child(a)
        return
    ensure_torch(a)
    rows, info = [], None
    for t in a.threads:
        cmd = [sys.executable, os.path.abspath(__file__), a.data, "--child", "--threads", str(t), "--runs", str(a.runs)]
        cmd += ["--batches"] + [str(b) for b in a.batches] + ["--models"] + a.models
        if a.quick:
            cmd.append("--quick")
        out = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(out.stderr)
        if out.returncode != 0:
            sys.exit(f"torch_train: the {t}-thread run failed ({out.returncode})")
        line = next(l for l in out.stdout.splitlines() if l.startswith("ROWS "))
        got = json.loads(line[5:])
        info = got["torch"]
        rows += got["rows"]
    print(f"PyTorch {info['version']} from {info['from']} (python {info['python']})")
    print(f"  BLAS_INFO={info['blas_info']}  MKL available: {info['mkl']}  oneDNN (mkldnn) available: {info['mkldnn']}")
    for l in info["config"]:
        print(f"  {l}")
    print(f"  loaded: {', '.join(info['libraries']) or '?'}")
    print("  (nn.Linear runs addmm/mm on that BLAS; nn.Conv2d runs aten::mkldnn_convolution, oneDNN)")
    print(f"PyTorch eager: time per training step (Adam lr {LEARNING_RATE}), median of {a.runs} runs, {WARMUP} warm-up steps")
    print(f"{'model':<5} {'batch':>5} {'threads':>7} {'steps':>6} {'eager ms':>10}")
    for r in rows:
        print(f"{r['model']:<5} {r['batch']:>5} {r['threads']:>7} {r['steps']:>6} {r['ms_per_step']:>10.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"torch": info, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
