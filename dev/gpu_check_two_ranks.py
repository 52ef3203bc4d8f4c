"""One rank of dev/gpu_check.sh's ``two_ranks`` stage (run by torchrun).

``torchrun --nproc_per_node 2 dev/gpu_check_two_ranks.py OUT_PREFIX
CONFIG [tools/train.py arguments]``: both ranks train the derived config
with ``tools/train.py`` (mmpretrain's, with the plugin) over **gloo**, on
the same device: with CUDA both on ``cuda:0`` (``LOCAL_RANK`` is set to 0
before mmengine reads it, so its ``torch.cuda.set_device`` and DDP's
``device_ids`` name the one GPU), without CUDA on the CPU. NCCL refuses
two ranks on one GPU ("Duplicate GPU detected"); gloo takes CUDA tensors
and stages them through host memory. Then the regulariser's gather
backward runs both ways (``reduce_scatter_probe``) and the rank writes
``OUT_PREFIX<rank>.json``: its steps, parameter digest and every collective
call (dev/gpu_check_hooks.py), whatever happened (``error`` says what
failed).

Not part of the plugin: a development harness.
"""
import json
import os
import os.path as osp
import runpy
import sys
import traceback

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def main() -> int:
    out_prefix, train_args = sys.argv[1], sys.argv[2:]
    torchrun_local_rank = os.environ.get('LOCAL_RANK', '0')
    rank = int(os.environ.get('RANK', '0'))
    import torch
    if torch.cuda.is_available():
        os.environ['LOCAL_RANK'] = '0'  # both ranks on cuda:0
    sys.path.insert(0, osp.join(ROOT, 'dev'))
    import gpu_check_hooks
    gpu_check_hooks.record_collectives()
    record = dict(
        rank=rank,
        torchrun_local_rank=int(torchrun_local_rank),
        cuda=torch.cuda.is_available(),
        torch=torch.__version__,
        error=None)
    train = osp.join(ROOT, 'tools', 'train.py')
    try:
        sys.path.insert(0, osp.dirname(train))
        sys.argv = [train] + train_args
        runpy.run_path(train, run_name='__main__')
        import torch.distributed as dist
        record.update(
            world_size=dist.get_world_size(),
            backend=str(dist.get_backend()),
            device=str(
                torch.device('cuda', torch.cuda.current_device()) if torch.
                cuda.is_available() else torch.device('cpu')))
        record.update(gpu_check_hooks.two_rank_record())
        record['probe'] = gpu_check_hooks.reduce_scatter_probe(
            torch.device(record['device']))
        record['probe']['collectives'] = gpu_check_hooks.collective_calls()
    except BaseException as error:  # noqa: B902 (recorded, then re-raised)
        record['error'] = ''.join(
            traceback.format_exception_only(type(error), error)).strip()
        for key, value in gpu_check_hooks.two_rank_record().items():
            record.setdefault(key, value)
        raise
    finally:
        with open(f'{out_prefix}{rank}.json', 'w') as f:
            json.dump(record, f, indent=2)
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == '__main__':
    sys.exit(main())
