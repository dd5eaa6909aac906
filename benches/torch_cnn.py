#!/usr/bin/env python3
"""PyTorch's side of examples/nd_cnn.rs: the same CNN (SINGA's, its
convolutions padded for 8x8 digits), batch, optimizer (Adam, lr 3e-3) and
digits, the same batches in the same order (the example's splitmix64
shuffle), trained eagerly on the CPU. Prints the time per iteration,
images/s, peak RSS and test accuracy for each thread count, each in a
process of its own (so that each peak RSS is its own).

    cargo run --release --features nd --example nd_cnn -- --dump /tmp/digits.bin
    python3 benches/torch_cnn.py /tmp/digits.bin            # 2 and 1 threads
    python3 benches/torch_cnn.py /tmp/digits.bin --epochs 10 --threads 2

The data file (`nd_cnn --dump`): three little-endian u32 (training samples,
test samples, pixels per sample), then the training pixels, training labels,
test pixels and test labels as little-endian f32.
"""

import argparse
import array
import resource
import struct
import subprocess
import sys
import time

BATCH = 64
LEARNING_RATE = 3e-3
SEED = 13  # the example's: epoch e shuffles with splitmix64 seeded SEED + 1 + e
CLASSES = 10
MASK = (1 << 64) - 1


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
    parts, at = [], 0
    for s in sizes:
        parts.append(values[at : at + s])
        at += s
    return n_train, n_test, features, parts


def run(path, threads, epochs):
    import torch
    from torch import nn

    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    n_train, n_test, features, (tx, ty, vx, vy) = load(path)
    side = int(features**0.5)
    train_x = torch.tensor(tx, dtype=torch.float32).reshape(n_train, 1, side, side)
    train_y = torch.tensor(ty, dtype=torch.float32).long()
    test_x = torch.tensor(vx, dtype=torch.float32).reshape(n_test, 1, side, side)
    test_y = torch.tensor(vy, dtype=torch.float32).long()

    model = nn.Sequential(
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
    adam = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    loss_fn = nn.CrossEntropyLoss()
    # Inputs made outside the step and filled per batch, as the example's.
    x = torch.empty(BATCH, 1, side, side)
    y = torch.empty(BATCH, dtype=torch.long)
    loss_sum = torch.zeros(())

    batches = n_train // BATCH
    orders = []
    for epoch in range(epochs):
        order = list(range(n_train))
        Rng(SEED + 1 + epoch).shuffle(order)
        orders.append(torch.tensor(order))

    start = time.perf_counter()
    for epoch in range(epochs):
        order = orders[epoch]
        for b in range(batches):
            ids = order[b * BATCH : (b + 1) * BATCH]
            x.copy_(train_x[ids])
            y.copy_(train_y[ids])
            adam.zero_grad()
            loss = loss_fn(model(x), y)
            loss_sum += loss.detach()
            loss.backward()
            adam.step()
        print(f"torch {threads} thread(s) epoch {epoch + 1}: training loss {loss_sum.item() / batches:.4f}")
        loss_sum.zero_()
    per_step = (time.perf_counter() - start) / (epochs * batches)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).float().mean().item()
    print(
        f"REPORT threads={threads} step_s={per_step} rss_kib={rss_kib} accuracy={accuracy} "
        f"torch={torch.__version__}"
    )


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="the digits, written by `nd_cnn --dump PATH`")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        run(a.data, a.threads[0], a.epochs)
        return
    reports = []
    for t in a.threads:
        cmd = [sys.executable, __file__, a.data, "--epochs", str(a.epochs), "--threads", str(t), "--child"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        sys.stdout.write(out.stdout)
        sys.stderr.write(out.stderr)
        if out.returncode != 0:
            sys.exit(f"the {t}-thread run failed ({out.returncode})")
        line = next(l for l in out.stdout.splitlines() if l.startswith("REPORT "))
        reports.append(dict(kv.split("=", 1) for kv in line.split()[1:]))
    print()
    print(
        f"PyTorch {reports[0]['torch']} (CPU, eager): SINGA's CNN on 8x8 digits, batch {BATCH}, "
        f"Adam lr {LEARNING_RATE}, {a.epochs} epochs"
    )
    print(f"{'threads':<8} {'ms/iter':>9} {'images/s':>9} {'peak RSS MiB':>13} {'test accuracy':>14}")
    for r in reports:
        s = float(r["step_s"])
        print(
            f"{r['threads']:<8} {s * 1e3:>9.3f} {BATCH / s:>9.0f} {int(r['rss_kib']) / 1024:>13.1f} "
            f"{float(r['accuracy']) * 100:>13.1f}%"
        )


if __name__ == "__main__":
    main()
