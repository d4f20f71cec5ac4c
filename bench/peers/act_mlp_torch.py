"""PyTorch eager side of the activation MLP comparison in docs/BENCHMARKS.md
(section "Vector transcendentals"): examples/mlp_cpu.mpt with another
activation, 784 -> 1024 -> 1024 -> 10, batch 512, Adam, float32, random data.

    python3 bench/peers/act_mlp_torch.py gelu [--threads 2]

The mptc side, same shapes:

    sed 's/activation=relu/activation=gelu/; s/fashion_mnist/synthetic(shape=[784], classes=10, samples=4096)/' \\
        examples/mlp_cpu.mpt > /tmp/mlp_gelu.mpt
    build/mptc bench /tmp/mlp_gelu.mpt --policy float32 --batch-sizes 512 --steps 20 --warmup 3 --device cpu

Prints the median step time of 30 steps after 5 warm-up steps."""
import argparse
import time

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("activation", choices=["gelu", "tanh", "sigmoid", "relu"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    act = {"gelu": nn.GELU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "relu": nn.ReLU}[args.activation]
    model = nn.Sequential(nn.Linear(784, 1024), act(), nn.Linear(1024, 1024), act(),
                          nn.Linear(1024, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(512, 784), torch.randint(0, 10, (512,))
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    for _ in range(5):
        step()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    print("%s MLP, PyTorch %s eager float32, %d threads: median %.2f ms/step"
          % (args.activation, torch.__version__, args.threads, 1000 * times[len(times) // 2]))


if __name__ == "__main__":
    main()
