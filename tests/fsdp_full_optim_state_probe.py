"""torchrun script: does FSDP's full optimizer state dict keep Adam's moments?

Run on 2 CPU processes (gloo). Rank 0 prints one JSON line: for each
parameter, whether the gathered ``exp_avg`` and ``exp_avg_sq`` are equal
(they never are after real Adam steps on random data).
"""
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullOptimStateDictConfig
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import FullStateDictConfig, StateDictType


def main() -> None:
    dist.init_process_group('gloo')
    torch.manual_seed(0)
    model = FSDP(torch.nn.Sequential(torch.nn.Linear(8, 16),
                                     torch.nn.Linear(16, 4)),
                 use_orig_params=True, device_id=torch.device('cpu'))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(5, 8)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    # mmengine's FSDPStrategy(state_dict_cfg='full') configuration.
    with FSDP.state_dict_type(
            model, StateDictType.FULL_STATE_DICT,
            FullStateDictConfig(rank0_only=True, offload_to_cpu=True),
            FullOptimStateDictConfig(rank0_only=True, offload_to_cpu=True)):
        state = FSDP.optim_state_dict(model, optimizer)['state']
    if dist.get_rank() == 0:
        print(json.dumps({
            name: bool(torch.equal(moments['exp_avg'], moments['exp_avg_sq']))
            for name, moments in state.items()}))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
