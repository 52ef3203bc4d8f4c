"""The plugin's tools end their process group before the interpreter ends.

Upstream (torch, to 2.14.1 at least): a process that exits with its
process group alive can abort in the interpreter's finalisation with
"terminate called without an active exception" (SIGABRT): gloo's worker
threads still hold work whose tensors are released after the interpreter
has begun tearing down (pytorch/pytorch#179291, an atexit fix proposed and
withdrawn in 2026). ``torchrun`` then reports the rank as failed (exit -6)
although training finished, and a Slurm job ends failed. mmpretrain's
``tools/train.py`` and ``tools/test.py`` never destroy their group. Seen
here in 2-process CPU test launches (3 of the last 6 full test runs).

:func:`release_process_group` frees the runner's leftovers (the DDP
reducer holds the group's work) and destroys the default group while the
interpreter is whole. ``tools/train.py`` and ``tools/test.py`` register it
with ``atexit`` once mmpretrain's script has returned normally (code that
runs the tool in its own process may still use the group until then);
after an exception they do not, since destroying a group can block on a
peer that has gone.
See docs/upstream_workarounds.md.
"""
import gc


def release_process_group() -> None:
    """Collect garbage, then destroy the default process group, if any."""
    import torch.distributed as dist
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()
