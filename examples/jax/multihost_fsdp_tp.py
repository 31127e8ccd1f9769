"""The fsdp_tp step across hosts: 2 processes x 4 CPU devices, joined by ``jax.distributed``.

Run with no arguments, it starts the two processes on localhost (each one a "host" with 4
CPU devices, talking over CPU collectives), lets them run shardsim's fsdp_tp forward and
backward on the 4 x 2 mesh of all 8 devices, and checks the result against the same step in
one process. Each process is this script again, with ``--process-id``::

    python examples/jax/multihost_fsdp_tp.py              # both processes, then the check
    python examples/jax/multihost_fsdp_tp.py --process-id 0 --port 12355 --out out.npz   # one host

On real hosts, ``jax.distributed.initialize()`` finds the coordinator itself (TPU, SLURM);
the shardsim code is the same.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

PROCESSES, DEVICES_PER_PROCESS = 2, 4
B, D, F = 16, 16, 32


def inputs() -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The same global inputs in every process (each places only its own devices' blocks)."""
    import shardsim

    rng = np.random.default_rng(0)
    params = shardsim.models.reference_mlp.init(D, F, seed=0)
    return params, rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32)


def one_host(process_id: int, port: int, out: str) -> None:
    """One process: join the others, run the step on the global mesh, save what this host sees."""
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives between processes
    jax.distributed.initialize(f"localhost:{port}", num_processes=PROCESSES, process_id=process_id)
    from shardsim.engines import jax as engine

    mesh = jax.make_mesh((4, 2), ("X", "Y"))  # all 8 devices of both processes
    params, x, dout = inputs()
    r = engine.run_strategy("fsdp_tp", mesh, params, x, dout, activation="relu")
    np.savez(out, out=r.out, **{f"d{k}": v for k, v in r.grads.items()})
    print(f"process {process_id}: {jax.local_device_count()} of {jax.device_count()} devices, "
          f"{len(r.trace.collectives())} collectives")  # fmt: skip
    jax.distributed.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def main() -> None:
    """Start both processes, wait for them, compare with the single-process run."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [str(Path(tmp) / f"host{i}.npz") for i in range(PROCESSES)]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--process-id", str(i), "--port", str(port), "--out", outs[i]],
            )
            for i in range(PROCESSES)
        ]
        codes = [p.wait(timeout=120) for p in procs]
        if any(codes):
            raise SystemExit(f"a process failed: exit codes {codes}")
        hosts = [dict(np.load(o)) for o in outs]

    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import shardsim
    from shardsim.engines import jax as engine

    params, x, dout = inputs()
    single = engine.run_strategy("fsdp_tp", shardsim.Mesh(X=4, Y=2), params, x, dout, activation="relu")
    want = {"out": single.out, **{f"d{k}": v for k, v in single.grads.items()}}
    # CPU collectives between processes sum in their own order: equal within float32's tolerance
    tol = shardsim.dtypes.tolerance("float32", F) * 8
    worst = 0.0
    for i, got in enumerate(hosts):
        for key, value in want.items():
            err = float(np.abs(got[key] - value).max()) / float(np.abs(value).max())
            assert err <= tol, f"process {i}: {key} differs by {err:.3g} (relative), above {tol:.3g}"
            worst = max(worst, err)
    print(
        f"{PROCESSES} processes x {DEVICES_PER_PROCESS} devices: out and gradients equal the single-process run "
        f"(largest relative difference {worst:.1e}, tolerance {tol:.1e})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--port", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.process_id is None:
        main()
    else:
        one_host(args.process_id, args.port, args.out)
