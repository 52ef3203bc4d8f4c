"""One key, one value: the named statistics wherever they are logged.

``MatrixInfoHook`` (training), ``RepresentationStatistics`` (evaluation)
and ``TCRLoss`` (the objective) take their definitions from
``mmae_plugin.matrix_info``; here the same features go through each of
them, same-named keys must be equal, and every definition matches its
float64 numpy reference (tests/scipy_matrix_info_reference.py).
"""
import math

import numpy as np
import pytest
import scipy_matrix_info_reference as ref
import torch

import mmae_plugin.registration  # noqa: F401  (registers the modules)
from mmae_plugin.engine.hooks.matrix_info_hook import MatrixInfoHook
from mmae_plugin.engine.monitoring.taps import to_embeddings
from mmae_plugin.evaluation.metrics import RepresentationStatistics
from mmae_plugin.evaluation.statistics import representation_statistics
from mmae_plugin.matrix_info import (POOLINGS, coding_rate, coding_rate_key,
                                     one_branch_statistics,
                                     pool_token_sequence)
from mmae_plugin.models import TCRLoss
from mmae_plugin.models.necks import pool_tokens


def features(n: int = 300,
             d: int = 16,
             seed: int = 0,
             offset: float = 3.0) -> torch.Tensor:
    """float32 features in a cone (a large common mean), like MAE's CLS:
    the uncentred and the centred kernels disagree on them."""
    gen = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=gen) / d**0.5
    spread = torch.randn(n, d, generator=gen) @ mixing
    return spread + offset * torch.ones(d)


def metric_values(z: torch.Tensor, **kwargs) -> dict:
    """What RepresentationStatistics reports for the rows of ``z``."""
    metric = RepresentationStatistics(**kwargs)
    metric.process(None, [{'frozen_feature': row} for row in z])
    return metric.compute_metrics(metric.results)


def hook_values(z: torch.Tensor, kernel: str, **kwargs) -> dict:
    """What MatrixInfoHook logs for the batch ``z`` (one branch)."""
    hook = MatrixInfoHook(kernel=kernel, cpu_threads=None, **kwargs)
    return {key: float(value) for key, value in hook.compute([z]).items()}


@pytest.mark.parametrize('kernel', ['covariance', 'gram'])
def test_hook_and_metric_agree_on_every_shared_key(kernel):
    z = features()
    from_metric = metric_values(z)
    from_hook = hook_values(z, kernel, tcr='reference', mu=1.0)
    suffix = {'covariance': 'cov', 'gram': 'gram'}[kernel]
    shared = set(from_hook) & set(from_metric)
    assert shared == {
        f'entropy_{suffix}', f'erank_{suffix}', 'rankme_raw',
        'tcr_reference_mu1'
    }
    for key in shared:
        assert from_hook[key] == from_metric[key], key


def test_metric_keys_match_their_float64_definitions():
    z = features()
    expected = ref.named_statistics(z.double().numpy())
    got = metric_values(z)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-10), key


@pytest.mark.parametrize('alpha', [0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize('form,mu,centering', [('reference', 1.0, False),
                                               ('paper', 0.5, True),
                                               ('reference', 3.0, True)])
def test_every_definition_matches_numpy(alpha, form, mu, centering):
    z = features(n=40, d=12, seed=1)
    values = one_branch_statistics(
        z, alpha=alpha, tcr=dict(form=form, mu=mu, centering=centering))
    expected = ref.named_statistics(z.double().numpy(), alpha, form, mu,
                                    centering)
    assert set(values) == set(expected)
    for key, value in expected.items():
        assert float(values[key]) == pytest.approx(value, rel=1e-9), key


def test_the_two_kernels_are_different_numbers_on_a_cone():
    """The reason keys name their kernel: erank_gram sees the cone's
    direction (near 1), erank_cov the spread around its mean."""
    values = representation_statistics(features(offset=30.0))
    assert values['erank_gram'] < 1.1
    assert values['erank_cov'] > 5 * values['erank_gram']


def test_tcr_loss_maximises_the_logged_coding_rate():
    z = features(n=64, d=16, seed=2)
    for form, mu, centering in [('reference', 1.0, False),
                                ('paper', 0.5, True)]:
        loss = TCRLoss(mu=mu, form=form, centering=centering, loss_weight=0.1)
        assert loss.key == coding_rate_key(form, mu, centering)
        value = coding_rate(z, form, mu, centering)
        assert float(loss(z)) == pytest.approx(-0.1 * float(value), rel=1e-6)
        assert float(value) == pytest.approx(
            ref.coding_rate(z.double().numpy(), form, mu, centering),
            rel=1e-10)
        logged = hook_values(
            z, 'covariance', tcr=form, mu=mu, centering=centering)
        assert logged[loss.key] == float(value)


def test_key_names_spell_every_setting():
    assert coding_rate_key('reference', 1, False) == 'tcr_reference_mu1'
    assert coding_rate_key('paper', 0.5, True) == 'tcr_paper_centered_mu0.5'
    z = features(n=20, d=6)
    two = MatrixInfoHook(
        kernel='gram', alpha=2.0, cpu_threads=None).compute([z, z + 0.1])
    assert set(two) == {
        'entropy_1_gram_alpha2', 'entropy_2_gram_alpha2',
        'mutual_info_gram_alpha2', 'joint_entropy_gram_alpha2',
        'matrix_js_gram', 'spectrum_js_gram'
    }


def test_a_collapsed_batch_logs_nan_for_the_undefined_kernel_statistics():
    collapsed = features(n=10, d=6)[:1].repeat(10, 1)
    values = metric_values(collapsed)
    assert math.isnan(values['erank_cov']) and \
        math.isnan(values['entropy_cov'])
    assert values['erank_gram'] == pytest.approx(1.0, abs=1e-9)
    assert values['rankme_raw'] == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError, match='zero matrix'):
        one_branch_statistics(collapsed)


# --------------------------------------------------------------------------
# Token pooling: one vocabulary, one definition
# --------------------------------------------------------------------------
@pytest.mark.parametrize('pooling', POOLINGS)
def test_every_pooling_site_computes_the_same_feature(pooling):
    tokens = torch.randn(5, 1 + 12, 8, dtype=torch.float64)
    expected = ref.pool(tokens.numpy(), pooling)
    for pooled in (pool_token_sequence(tokens,
                                       pooling), pool_tokens(tokens, pooling),
                   to_embeddings(tokens, pooling)):
        np.testing.assert_allclose(
            pooled.numpy(), expected, rtol=1e-12, atol=1e-15)


def test_mmae_pools_its_feature_with_the_shared_definition():
    from mmengine.config import Config
    from mmpretrain.registry import MODELS
    cfg = Config.fromfile('configs/fashion_mnist/mmae_fmnist.py').model
    latent = torch.randn(3, 13, 128)
    for pooling in ('cls', 'mean', 'cls+mean'):
        model = MODELS.build({**cfg, 'feature': pooling})
        torch.testing.assert_close(
            model.pool(latent), pool_token_sequence(latent, pooling))
    with pytest.raises(ValueError, match="renamed 'mean'"):
        MODELS.build({**cfg, 'feature': 'mean_visible'})
