"""Several processes, one run: the little that seal-lite needs from torch.distributed, in one place.

A run across N processes is started by a launcher (``accelerate launch``, ``torchrun``, or ``seal-lite run
--processes N``, which calls accelerate), which sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous address in
each process's environment. seal-lite grows no distributed layer of its own: TRL's trainer runs on accelerate
(DDP, DeepSpeed, FSDP), and this module only adds what the SEAL step shares besides gradients:

* ``gather`` hands every process the list of every process's object (in rank order): each rank rolls out its
  own groups, and all of them compute the step's advantages, weights, rho and interface from all the results;
* ``on_main`` runs a function on rank 0 alone (the store, the diagnoser) and hands its result, or its error, to
  every rank;
* ``barrier`` waits for every rank (a checkpoint is committed once every rank's part of it is on disk).

In one process (no launcher) every function is the identity: rank 0 of 1, and nothing is imported or started,
so a one-process run behaves exactly as it did before this module existed.

A rank that dies stops the others: the launcher tears the job down when one worker exits, a collective with a
dead peer fails at once (gloo, NCCL), and a hung peer fails the others after ``TIMEOUT``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = timedelta(minutes=30)  # a collective waits this long for a hung peer (torch's own default for gloo)


def world_size() -> int:
    """How many processes the launcher started for this run (1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's index among them (0 without a launcher)."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """This process's index on its machine: the GPU it uses."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """How many of the run's processes share this machine (its cores, when they are CPU processes)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def is_main() -> bool:
    """Rank 0: the process that writes the store and checkpoints, runs the diagnoser and prints."""
    return rank() == 0


def init() -> None:
    """Join the launcher's process group (gloo on CPUs, NCCL on GPUs) through accelerate, as TRL's trainer does
    later: it then finds the group already there. Nothing happens in one process, or when already joined."""
    if world_size() == 1:
        return
    import torch
    import torch.distributed as dist
    from accelerate import PartialState

    if not torch.cuda.is_available():
        # accelerate names a CPU process's device cpu:0, which torch.load cannot map a checkpoint's tensors to
        # (transformers' optimizer load on resume); plain cpu it can
        os.environ.setdefault("ACCELERATE_TORCH_DEVICE", "cpu")
    if not dist.is_initialized():
        PartialState(cpu=not torch.cuda.is_available(), timeout=TIMEOUT)


def gather(value: T) -> list[T]:
    """Every rank's ``value``, in rank order, on every rank (``[value]`` in one process)."""
    if world_size() == 1:
        return [value]
    import torch.distributed as dist

    values = [None] * world_size()
    dist.all_gather_object(values, value)
    return values


def broadcast(value: T) -> T:
    """Rank 0's ``value`` on every rank (the others pass anything, e.g. None)."""
    if world_size() == 1:
        return value
    import torch.distributed as dist

    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def on_main(function: Callable[[], T]) -> T:
    """``function()`` run on rank 0 alone; every rank returns its result, or raises the exception it raised (so
    all ranks stop together, each with the same error)."""
    if world_size() == 1:
        return function()
    outcome = None
    if is_main():
        try:
            outcome = ("value", function())
        except Exception as error:
            outcome = ("error", error)
    kind, value = broadcast(outcome)
    if kind == "error":
        raise value
    return value


def barrier() -> None:
    """Wait until every rank is here."""
    if world_size() == 1:
        return
    import torch.distributed as dist

    dist.barrier()


def my_share(items: list[T]) -> list[T]:
    """This rank's contiguous share of ``items`` (the first ranks take one more when they do not divide evenly):
    concatenating every rank's share in rank order gives ``items`` back."""
    size, extra = divmod(len(items), world_size())
    start = rank() * size + min(rank(), extra)
    return items[start : start + size + (rank() < extra)]


def launch_command(processes: int, program: list[str]) -> list[str]:
    """The ``accelerate launch`` command that runs ``python <program>`` (e.g. ``-m seal_lite run recipe.yaml``) in
    ``processes`` processes on this machine, at a free port (two runs on one machine must not share one). On a CPU it is accelerate's
    ``--multi_gpu`` launcher too (torchrun underneath; the processes then join with gloo): accelerate's ``--cpu``
    launcher needs MPI for several processes. Mixed precision is the trainer's (bf16/fp16 from the policy's dtype),
    whatever accelerate is told here."""
    import sys

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
            *program]
