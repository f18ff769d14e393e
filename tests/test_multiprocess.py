"""Training across processes: examples/multiprocess.py run whole.

It starts two processes joined by `jax.distributed` on localhost (gloo CPU
collectives), two CPU devices each, so one mesh of 4 devices spans both. Each
imports eqxopt before `jax.distributed.initialize` (which refuses to run once a
backend is up), trains an Equinox MLP for 10 jitted `opt.step(..., donate=True)`
steps data parallel with AdamW and FSDP with ClipByGlobalNorm + AdamW, and
checks that every parameter and moment kept its sharding. This process trains
the same on one device; the gathered parameters and state must agree to float32
rounding (the gradient is summed over the batch in another order) after moving
well beyond that. Every worker runs under a deadline, so a hang fails the test.
"""

import os
import pathlib
import socket

from helpers import load_script, package_path

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_two_processes_train_like_one(monkeypatch, capsys):
    example = load_script("examples/multiprocess.py")
    # The workers import this checkout's eqxopt.
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([package_path(), path]))
    # The first coordinator port offered is one a socket here holds, as if another
    # program took it after it was found free: the launcher must notice and start
    # again on a fresh port (its retry, otherwise untested).
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        ports = [holder.getsockname()[1]]
        free_port = example.free_port
        monkeypatch.setattr(
            example, "free_port", lambda: ports.pop() if ports else free_port()
        )
        args = "--processes 2 --local-devices 2 --steps 10 --timeout 180"
        status = example.main(args.split())
    out = capsys.readouterr().out
    assert status == 0, out
    assert "the coordinator's port was taken; trying another" in out, out
    assert "2 processes x 2 CPU devices, 10 steps" in out, out
    assert out.rstrip().endswith("multiprocess: OK"), out
