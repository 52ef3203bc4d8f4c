"""MMAEFSDPStrategy's fixes act only inside the strategy's own calls.

The 2-process FSDP runs (resume bit for bit, Adam moments of the full state
dict) are in tests/test_tools_fsdp.py.
"""
import json
import math
import os
import re
from functools import partial

import pytest
import torch
from _helpers_gloo import run_gloo_ranks
from conftest import REPO_ROOT, run_local_ranks
from mmengine._strategy import FSDPStrategy
from mmengine.config import Config
from mmengine.dataset import default_collate
from mmengine.registry import STRATEGIES, DefaultScope
from mmpretrain.registry import DATASETS, MODELS
from test_hook_all_ssl_algorithms import CASES, random_images, shrunk_config
from torch.distributed.fsdp import FullStateDictConfig
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.strategies import (MMAEFSDPStrategy,
                                           gathered_states_copied)
from mmae_plugin.engine.strategies.fsdp import (per_rank_seed,
                                                why_fsdp_cannot_train)
from mmae_plugin.engine.strategies.fsdp_optim_state_copy import \
    copy_out_of_gather_buffer

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason='torch without distributed')


def test_strategy_is_registered_and_is_mmengine_fsdp():
    assert STRATEGIES.get('MMAEFSDPStrategy') is MMAEFSDPStrategy
    assert issubclass(MMAEFSDPStrategy, FSDPStrategy)
    assert STRATEGIES.get('FSDPStrategy') is FSDPStrategy


def test_torch_function_is_swapped_only_inside_the_block():
    from torch.distributed.fsdp import _optim_utils
    original = _optim_utils._unflatten_orig_param_states
    with gathered_states_copied():
        inside = _optim_utils._unflatten_orig_param_states
        assert inside is not original and inside.__wrapped__ is original
    assert _optim_utils._unflatten_orig_param_states is original
    with pytest.raises(KeyError):
        with gathered_states_copied():
            raise KeyError('an error inside optim_state_dict')
    assert _optim_utils._unflatten_orig_param_states is original


def unflatten_like_torch_on_cpu(fsdp_param_info, output_states, state_name,
                                shard_state, to_save, cpu_offload):
    """What torch's function does to CPU views: reshape, then ``.cpu()``
    (a no-op on the CPU) under offload, ``clone`` otherwise."""
    if not to_save:
        return
    for state in output_states.values():
        value = state[state_name].reshape(2, 2)
        state[state_name] = value.cpu() if cpu_offload else value.clone()


@pytest.mark.parametrize('cpu_offload', [True, False])
def test_gathered_states_no_longer_alias_the_buffer(cpu_offload):
    unflatten = copy_out_of_gather_buffer(unflatten_like_torch_on_cpu)
    buffer = torch.arange(8.)
    states = {'a': {}, 'b': {}}
    results = {}
    for state_name, values in (('exp_avg', (1., 2.)), ('exp_avg_sq', (3.,
                                                                      4.))):
        buffer[:4], buffer[4:] = values  # torch's all-gather into one buffer
        states['a'][state_name], states['b'][state_name] = buffer[:4], \
            buffer[4:]
        unflatten(None, states, state_name, False, True, cpu_offload)
        results[state_name] = {fqn: s[state_name] for fqn, s in states.items()}
    buffer.fill_(-1.)  # the buffer's next use
    for state_name, (a, b) in (('exp_avg', (1., 2.)), ('exp_avg_sq', (3.,
                                                                      4.))):
        assert torch.equal(results[state_name]['a'], torch.full((2, 2), a))
        assert torch.equal(results[state_name]['b'], torch.full((2, 2), b))


def test_ranks_that_keep_nothing_are_left_alone():
    unflatten = copy_out_of_gather_buffer(unflatten_like_torch_on_cpu)
    view = torch.zeros(4)
    states = {'a': {'exp_avg': view}}
    unflatten(None, states, 'exp_avg', False, False, True)
    assert states['a']['exp_avg'] is view


@pytest.mark.parametrize(
    'checkpoint,expected',
    [(dict(meta=dict(seed=10)), dict(meta=dict(seed=7))),
     (dict(meta=dict(seed=None)), dict(meta=dict(seed=None))),
     (dict(meta=[]), dict(meta=[])), (dict(), dict())])
def test_per_rank_seed_undoes_the_offset(checkpoint, expected):
    per_rank_seed(checkpoint, 3)
    assert checkpoint == expected


def recipe_strategy(work_dir, rank, model_wrapper=None):
    """The FSDP recipe's strategy, built on this gloo rank with the recipe's
    randomness (each rank its own seed) and FSDP on the CPU.

    Args:
        work_dir: The strategy's work_dir.
        rank: This process's rank (torchrun's LOCAL_RANK, which mmengine
            reads).
        model_wrapper: Keys replacing the recipe's ``model_wrapper`` ones.
    """
    cfg = Config.fromfile(
        os.path.join(REPO_ROOT, 'configs', 'mmae_vit-large_200e_fsdp.py'))
    # The configs' default_scope, as the runner sets it (spawned process).
    if DefaultScope.get_current_instance() is None:
        DefaultScope.get_instance('fsdp_test', scope_name='mmpretrain')
    os.environ['LOCAL_RANK'] = str(rank)
    cfg.strategy.model_wrapper.update(device_id='cpu', **(model_wrapper or {}))
    return STRATEGIES.build(
        dict(
            cfg.strategy,
            work_dir=work_dir,
            env_kwargs=dict(
                launcher='pytorch',
                randomness=dict(seed=0, diff_rank_seed=True))))


def fmnist_mmae_config():
    """The tiny M-MAE's config (Fashion-MNIST, ViT 4 x 128)."""
    return Config.fromfile(
        os.path.join(REPO_ROOT, 'configs', 'fashion_mnist', 'mmae_fmnist.py'))


def fsdp_initial_state(out_dir, init_weights, rank, world):
    """Wrap the tiny M-MAE with the recipe's strategy as
    ``FlexibleRunner.train`` does (``strategy.prepare``); save the full
    (gathered) state dict of the initial weights, return its path."""
    strategy = recipe_strategy(os.path.join(out_dir, f'work{world}'), rank)
    strategy.prepare(
        fmnist_mmae_config().model,
        dispatch_kwargs=dict(init_weights_for_test_or_val=init_weights))
    with FSDP.state_dict_type(strategy.model, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(rank0_only=False)):
        state = strategy.model.state_dict()
    path = os.path.join(out_dir, f'world{world}_rank{rank}.pth')
    torch.save(state, path)
    return path


def initial_states(tmp_path, world, init_weights=True):
    """Every rank's full initial state dict in a ``world``-process run."""
    paths = run_gloo_ranks(
        partial(fsdp_initial_state, str(tmp_path), init_weights), world,
        str(tmp_path))
    return [torch.load(path, weights_only=True) for path in paths]


def states_equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_initial_weights_do_not_depend_on_the_world_size(tmp_path):
    """1 and 2 gloo processes start from the same weights under the recipe's
    ``diff_rank_seed``: mmengine's ``BaseStrategy._init_model_weights``
    broadcasts rank 0's weights (seeded ``seed + 0`` at any world size)
    after ``init_weights``, before the FSDP wrap shards them. (The full
    state dict is gathered from every rank's shard, so it is the same on
    both ranks by construction; what is compared is 1 vs 2 processes.)"""
    (one, ), (two, _) = initial_states(tmp_path / 'one', 1), \
        initial_states(tmp_path / 'two', 2)
    assert len(one) > 10  # every parameter and buffer of the tiny M-MAE
    assert states_equal(one, two)


def test_without_the_init_broadcast_the_world_size_would_show(tmp_path):
    """What the test above rests on: under ``diff_rank_seed`` rank 1 builds
    other weights than rank 0, so without the broadcast after
    ``init_weights`` (skipped here, as mmengine skips it for test/val with
    ``init_weights_for_test_or_val=False``) the gathered weights of 2
    processes (rank 1's shard from its own seed) are not 1 process's."""
    (one, ), (two, _) = initial_states(tmp_path / 'one', 1, False), \
        initial_states(tmp_path / 'two', 2, False)
    assert not states_equal(one, two)


def bf16_policy_train_step(out_dir, rank, world):
    """The recipe's strategy with the recipe's optimizer wrapper (bfloat16
    autocast, no scaler) on the tiny M-MAE: the FSDP policy of every unit,
    one training step on 4 Fashion-MNIST images, and the refusal of a
    float16 policy under bfloat16 autocast."""
    cfg = fmnist_mmae_config()
    optim_wrapper = dict(
        cfg.optim_wrapper,
        type='MixedPrecisionOptimWrapper',
        dtype='bfloat16',
        use_fsdp=True)
    strategy = recipe_strategy(os.path.join(out_dir, 'bf16'), rank)
    model, optim_wrapper_built = strategy.prepare(
        cfg.model, optim_wrapper=optim_wrapper)
    policies = sorted({(str(unit.mixed_precision.param_dtype),
                        str(unit.mixed_precision.reduce_dtype),
                        str(unit.mixed_precision.buffer_dtype))
                       for unit in FSDP.fsdp_modules(model)})
    before = [p.detach().clone() for p in model.parameters()]
    dataset = DATASETS.build(dict(cfg.train_dataloader.dataset, indices=4))
    computed_with = []
    projection = model.module.backbone.patch_embed.projection
    handle = projection.register_forward_pre_hook(
        lambda module, args: computed_with.append(str(module.weight.dtype)))
    losses = model.train_step(
        default_collate([dataset[i] for i in range(4)]), optim_wrapper_built)
    handle.remove()
    changed = any(not torch.equal(a, p.detach())
                  for a, p in zip(before, model.parameters()))
    refused = ''
    try:
        recipe_strategy(
            os.path.join(out_dir, 'fp16'), rank,
            dict(mixed_precision=dict(param_dtype='float16'))).prepare(
                cfg.model, optim_wrapper=optim_wrapper)
    except ValueError as error:
        refused = str(error)
    return dict(
        policies=policies,
        computed_with=computed_with,
        finite=all(math.isfinite(float(v.detach())) for v in losses.values()),
        loss_keys=sorted(losses),
        changed=changed,
        shard_dtypes=sorted({str(p.dtype)
                             for p in model.parameters()}),
        refused=refused)


def test_recipe_trains_under_a_bfloat16_fsdp_policy(tmp_path):
    """The recipe's FSDP policy: parameters gathered and computed in
    bfloat16, gradients reduced in float32, buffers float32, on every FSDP
    unit; a training step on 2 gloo ranks moves the float32 shards; a
    float16 policy under the recipe's bfloat16 autocast is refused naming
    both settings."""
    for result in run_gloo_ranks(
            partial(bf16_policy_train_step, str(tmp_path)), 2, str(tmp_path)):
        assert result['policies'] == [[
            'torch.bfloat16', 'torch.float32', 'torch.float32'
        ]]
        # The gathered weights the forward computes with: bfloat16.
        assert result['computed_with'] == ['torch.bfloat16']
        assert result['finite'] and result['changed']
        assert {'loss_rec', 'loss_tcr'} <= set(result['loss_keys'])
        assert result['shard_dtypes'] == ['torch.float32']
        assert 'mixed_precision.param_dtype=float16' in result['refused']
        assert 'optim_wrapper.dtype (autocast) is bfloat16' in \
            result['refused']


def head_target_dtypes(out_dir, rank, world):
    """One training step of the tiny M-MAE through the recipe's strategy
    and optimizer wrapper (bfloat16 autocast): the dtype of the pixels the
    reconstruction head receives, with the recipe's policy and with FSDP's
    default ``cast_root_forward_inputs=True``; and the refusal of uncast
    images without autocast."""
    cfg = fmnist_mmae_config()
    optim_wrapper = dict(
        cfg.optim_wrapper,
        type='MixedPrecisionOptimWrapper',
        dtype='bfloat16',
        use_fsdp=True)
    dataset = DATASETS.build(dict(cfg.train_dataloader.dataset, indices=4))
    batch = default_collate([dataset[i] for i in range(4)])
    received = {}
    fsdp_default = dict(mixed_precision=dict(cast_root_forward_inputs=True))
    for label, overrides in (('recipe', None), ('cast_root', fsdp_default)):
        strategy = recipe_strategy(
            os.path.join(out_dir, label), rank, overrides)
        model, built = strategy.prepare(cfg.model, optim_wrapper=optim_wrapper)
        head, dtypes = model.module.head, []

        def recorded_loss(pred, target, mask, loss=head.loss, dtypes=dtypes):
            dtypes.append(str(target.dtype))
            return loss(pred, target, mask)

        head.loss = recorded_loss
        model.train_step(batch, built)
        received[label] = dtypes
    refused = ''
    try:
        recipe_strategy(os.path.join(out_dir, 'eager'), rank).prepare(
            cfg.model, optim_wrapper=cfg.optim_wrapper)  # no autocast
    except ValueError as error:
        refused = str(error)
    return dict(received=received, refused=refused)


def test_recipe_head_receives_float32_pixels(tmp_path):
    """The recipe's policy (``cast_root_forward_inputs=False``) leaves the
    preprocessed images float32 until the model's own autocast, so MAE's
    normalised-pixel target is built from float32 pixels on 2 gloo FSDP
    ranks; FSDP's default would hand the head bfloat16 pixels. Without
    autocast the policy is refused, naming the setting."""
    for result in run_gloo_ranks(
            partial(head_target_dtypes, str(tmp_path)), 2, str(tmp_path)):
        assert result['received'] == dict(
            recipe=['torch.float32'], cast_root=['torch.bfloat16'])
        assert 'cast_root_forward_inputs=False needs the optimizer wrapper' \
            in result['refused']


# --------------------------------------------- forwards writing parameters
@pytest.fixture(scope='module')
def image_folder(tmp_path_factory):
    return random_images(tmp_path_factory.mktemp('images'))


def test_fsdp_discards_or_breaks_parameter_writing_forwards(
        tmp_path, image_folder, cpu_dist_env):
    """Why the strategy refuses CAE, BEiT v2, SwAV, momentum networks and
    CLIP teachers: on 2 ranks, two steps at lr 0 move CAE's teacher and
    BEiT v2's codebook bare but not under FSDP; the first FSDP step of SwAV
    (autograd) and MoCo v2 (its EMA update) fails, and FSDP refuses to wrap
    MILAN's CLIP teacher. If torch changes any of it, this fails: lift that
    refusal (why_fsdp_cannot_train) then."""
    proc = run_local_ranks(
        'tests/fsdp_param_writes_driver.py',
        image_folder,
        str(tmp_path),
        env=cpu_dist_env,
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        outcome = json.loads((tmp_path / f'rank{rank}.json').read_text())
        teacher = [
            k for k in outcome['cae/bare']['changed']
            if k.startswith('teacher.')
        ]
        assert len(teacher) > 10  # the control: bare, the teacher moves
        assert outcome['cae/fsdp'] == dict(changed=[])
        codebook = 'target_generator.quantize.embedding.weight'
        assert codebook in outcome['beitv2/bare']['changed']
        assert codebook not in outcome['beitv2/fsdp']['changed']
        assert 'changed' in outcome['swav/bare']
        assert 'modified inplace' in outcome['swav/fsdp']['error']
        assert 'changed' in outcome['mocov2/bare']
        assert 'must match the size' in outcome['mocov2/fsdp']['error']
        assert 'changed' in outcome['milan/bare']
        assert "FSDP doesn't support scalar parameters" in \
            outcome['milan/fsdp']['error']


@pytest.mark.parametrize('name,reason', [
    ('cae', 'CAE (the model)'),
    ('beitv2', 'NormEMAVectorQuantizer (target_generator.quantize)'),
    ('swav', 'SwAVLoss (head.loss_module)'),
    ('mocov2', 'ExponentialMovingAverage (encoder_k)'),
    ('byol', 'CosineEMA (target_net)'),
    ('milan', 'the parameter target_generator.tokenizer.logit_scale'),
])
def test_strategy_refuses_what_fsdp_cannot_train_by_name(
        name, reason, tmp_path, image_folder, tiny_clip):
    cfg = shrunk_config(CASES[name], str(tmp_path), image_folder, tiny_clip)
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        model = MODELS.build(cfg.model)
    with pytest.raises(
            ValueError,
            match=rf'strategy=MMAEFSDPStrategy cannot train this model: '
            rf'{re.escape(reason)} .*Train it without a strategy'):
        MMAEFSDPStrategy(work_dir=str(tmp_path))._wrap_model(model)


def test_mae_family_is_not_refused(tmp_path, image_folder):
    cfg = shrunk_config(CASES['mae'], str(tmp_path), image_folder, 'no-clip')
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        assert why_fsdp_cannot_train(MODELS.build(cfg.model)) is None
