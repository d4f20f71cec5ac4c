"""PyTorch DistributedDataParallel (gloo) beside `mpirun -np N mptc train`:
the same model (bench/peers/common.py), global batch and optimizer, N ranks
of T threads each on this machine, as PyTorch's own documentation sets DDP
up on CPUs (one process per rank, torch.distributed with the gloo backend,
DDP's default 25 MiB buckets overlapping the backward pass). Prints one
JSON line: the median step time, and the step time without the gradient
reduction (DDP's no_sync()), whose difference is the time communication
adds to a step.

    python3 bench/dist/ddp_peer.py --model mlp_cpu --ranks 2 --threads 1 --batch 512
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peers"))
import common  # noqa: E402
import torch_peer  # noqa: E402


def worker(rank, args, out):
    import numpy as np
    import torch
    import torch.distributed as dist
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(1)
    cargs = argparse.Namespace(device="cpu", image_size=None, seed=1 + rank)
    model = torch_peer.build(torch, args.model, cargs)
    conv = common.MODELS[args.model]["kind"] != "mlp"
    if conv:
        model = model.to(memory_format=torch.channels_last)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if args.ranks > 1 else model
    opt, _ = torch_peer.optimizer(torch, args.model, ddp.parameters(), "cpu")
    local = args.batch // args.ranks
    # the two batches mptc's timing loop alternates (warm-up included)
    batches = []
    for x, y in common.synthetic(np, args.model, cargs, local):
        xt = torch.from_numpy(x)
        if conv:
            xt = xt.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        batches.append((xt, torch.from_numpy(y).long()))
    it = [0]

    def step(sync=True):
        opt.zero_grad(set_to_none=True)
        ctx = ddp.no_sync() if (not sync and args.ranks > 1) else torch.enable_grad()
        xt, yt = batches[it[0] % 2]
        it[0] += 1
        with ctx:
            loss = torch.nn.functional.cross_entropy(ddp(xt).float(), yt)
            loss.backward()
        opt.step()

    def timed(sync):
        for _ in range(args.warmup):
            step(sync)
        ms = []
        for _ in range(args.steps):
            dist.barrier() if args.ranks > 1 else None
            t0 = time.perf_counter()
            step(sync)
            ms.append(1000 * (time.perf_counter() - t0))
        return statistics.median(ms)

    if args.ranks == 1:
        dist.barrier()
    with_comm = timed(True)
    without = timed(False)
    if rank == 0:
        out.put(dict(peer="torch-ddp-gloo", model=args.model, ranks=args.ranks,
                     threads=args.threads, batch=args.batch, ms_per_step=round(with_comm, 3),
                     ms_without_reduction=round(without, 3), torch=torch.__version__))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mlp_cpu", choices=sorted(common.MODELS))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--port", type=int, default=0, help="rendezvous port (default: a free one)")
    args = p.parse_args()
    if not args.port:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, out)) for r in range(args.ranks)]
    for pr in procs:
        pr.start()
    import queue
    row = None
    while row is None:
        try:
            row = out.get(timeout=1)
        except queue.Empty:
            dead = [pr for pr in procs if pr.exitcode not in (None, 0)]
            if dead:
                for pr in procs:
                    pr.kill()
                sys.exit(f"ddp_peer: rank {procs.index(dead[0])} exited with status {dead[0].exitcode}")
    for pr in procs:
        pr.join()
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
