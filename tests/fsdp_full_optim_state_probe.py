"""torchrun script: does FSDP's full optimizer state dict keep Adam's moments?

Run on 2 CPU processes (gloo). Both ranks train the same FSDP model on the
same random batches, so every rank's gradient equals the unsharded one and
an unwrapped copy trained beside it is the reference. Rank 0 prints one
JSON line: for each parameter, whether the gathered ``exp_avg`` and
``exp_avg_sq`` are equal (they never are after real Adam steps on random
data), and whether each gathered moment matches the reference's.

Without arguments it runs plain torch (no plugin code is imported), which
is what the strict xfail pins; ``--plugin-fix`` computes the state dict
inside ``mmae_plugin.engine.strategies.gathered_states_copied()``, the
workaround ``MMAEFSDPStrategy.optim_state_dict`` runs in.
"""
import argparse
import copy
import json
from typing import Dict

import torch
import torch.distributed as dist
from torch.distributed.fsdp import (FullOptimStateDictConfig,
                                    FullStateDictConfig)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType

STEPS = 2


def full_optimizer_state(model: FSDP,
                         optimizer,
                         plugin_fix: bool = False) -> Dict[str, dict]:
    """The optimizer state as mmengine's ``state_dict_cfg='full'`` saves it.

    Args:
        model: The FSDP-wrapped model.
        optimizer: Its optimizer.
        plugin_fix: Compute it inside the plugin's workaround.

    Returns:
        ``{parameter name: {state name: tensor}}`` on rank 0; empty on the
        others (``rank0_only``).
    """
    with FSDP.state_dict_type(
            model, StateDictType.FULL_STATE_DICT,
            FullStateDictConfig(rank0_only=True, offload_to_cpu=True),
            FullOptimStateDictConfig(rank0_only=True, offload_to_cpu=True)):
        if not plugin_fix:
            return FSDP.optim_state_dict(model, optimizer).get('state', {})
        from mmae_plugin.engine.strategies import gathered_states_copied
        with gathered_states_copied():
            return FSDP.optim_state_dict(model, optimizer).get('state', {})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--plugin-fix', action='store_true')
    plugin_fix = parser.parse_args().plugin_fix
    dist.init_process_group('gloo')
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    reference = copy.deepcopy(plain)
    model = FSDP(plain, use_orig_params=True, device_id=torch.device('cpu'))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    for _ in range(STEPS):
        batch = torch.randn(5, 8)
        for net, optim in ((model, optimizer), (reference,
                                                reference_optimizer)):
            net(batch).square().sum().backward()
            optim.step()
            optim.zero_grad()
    state = full_optimizer_state(model, optimizer, plugin_fix)
    expected = {
        name: reference_optimizer.state[param]
        for name, param in reference.named_parameters()
    }
    if dist.get_rank() == 0:
        print(
            json.dumps({
                name: dict(
                    moments_equal=bool(
                        torch.equal(moments['exp_avg'],
                                    moments['exp_avg_sq'])),
                    matches_reference={
                        key: bool(
                            torch.allclose(
                                moments[key],
                                expected[name][key],
                                rtol=1e-5,
                                atol=1e-8))
                        for key in ('exp_avg', 'exp_avg_sq')
                    })
                for name, moments in state.items()
            }))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
