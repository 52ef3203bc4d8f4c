"""The TCR regulariser's fewer dispatches: the fused autograd nodes give the
values of the chains they replace bit for bit, gradients equal to
autograd's, the float64 reference's value, and the op counts that
dev/benchmarks/regulariser_ops.py reports."""
import math

import numpy as np
import pytest
import scipy_matrix_info_reference as reference
import torch
from _helpers_scripts import load_script

from mmae_plugin.matrix_info.coding_rate import (row_magnitudes,
                                                 unit_rows_unchecked)
from mmae_plugin.matrix_info.gram_logdet import (ridge_gram_logdet_flagged,
                                                 signed_ridge_gram_logdet)


@pytest.fixture(scope='module')
def ops_tool():
    return load_script('dev/benchmarks/regulariser_ops.py')


def unit_features(rows: int, dim: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    return z / z.norm(dim=1, keepdim=True)


@pytest.mark.parametrize('rows,dim', [(40, 24), (24, 40)])
@pytest.mark.parametrize('sign', [1.0, -1.0])
@pytest.mark.parametrize('scale', [1.0, 0.37])
def test_signed_logdet_is_the_flagged_chain_bit_for_bit(
        rows, dim, sign, scale):
    z = unit_features(rows, dim, seed=rows + dim)
    samples_side = rows < dim
    offset = (dim - rows) * math.log(1.5) if samples_side else 0.0
    fused = signed_ridge_gram_logdet(z, 1.5, samples_side, scale, offset, sign)
    chained, ok = ridge_gram_logdet_flagged(z * scale, 1.5, samples_side)
    chained = offset + chained
    assert bool(ok)
    assert torch.equal(fused, chained if sign == 1.0 else -chained)


@pytest.mark.parametrize('rows,dim', [(40, 24), (24, 40)])
def test_signed_logdet_gradient_is_autograds(rows, dim):
    z = unit_features(rows, dim, seed=3).requires_grad_()
    samples_side = rows < dim
    signed_ridge_gram_logdet(z, 0.8, samples_side, 0.5, 0.0, -1.0).backward()
    fused = z.grad.clone()
    z.grad = None
    scaled = z * 0.5
    gram = scaled.T @ scaled
    (-torch.logdet(gram + 0.8 * torch.eye(dim, dtype=z.dtype))).backward()
    torch.testing.assert_close(fused, z.grad, rtol=1e-10, atol=1e-12)


def test_signed_logdet_refuses_other_signs():
    with pytest.raises(ValueError, match='sign must be 1.0 or -1.0'):
        signed_ridge_gram_logdet(unit_features(4, 3, 0), 1.0, False, sign=0.5)


def test_unit_rows_value_and_gradient_are_autograds():
    generator = torch.Generator().manual_seed(5)
    z = (
        torch.randn(16, 12, generator=generator, dtype=torch.float64) *
        torch.logspace(-3, 3, 16, dtype=torch.float64).unsqueeze(1))
    z.requires_grad_()
    weights = torch.randn(16, 12, generator=generator, dtype=torch.float64)
    magnitude = row_magnitudes(z)
    fused = unit_rows_unchecked(z, magnitude)
    (fused * weights).sum().backward()
    fused_grad = z.grad.clone()
    z.grad = None
    scaled = z / magnitude.unsqueeze(1)
    chained = scaled / torch.linalg.vector_norm(scaled, dim=1, keepdim=True)
    (chained * weights).sum().backward()
    assert torch.equal(fused, chained)
    torch.testing.assert_close(fused_grad, z.grad, rtol=1e-10, atol=1e-14)


def test_tcr_loss_at_the_gathered_shape_is_the_float64_reference(ops_tool):
    """The recipe's regulariser on 256 x 192 float32 features (the
    1024 x 768 of ViT-B, smaller): the numpy/scipy float64 value."""
    regulariser = ops_tool.build_regulariser(ops_tool.RECIPE)
    z = ops_tool.features(256, 192, seed=1)
    loss = regulariser(z)
    loss.backward()
    expected = -regulariser.loss_weight * reference.coding_rate(
        z.detach().double().numpy(), 'reference', 1.0, False)
    assert loss.item() == pytest.approx(expected, rel=1e-6)  # float32 loss
    assert float(regulariser.skip_code) == 0
    assert torch.isfinite(z.grad).all() and z.grad.abs().sum() > 0


def test_op_counts_of_the_fused_parts(ops_tool):
    """The log-determinant's node dispatches 10 ops forward and 7 backward
    (d-side, with the reference form's scale), the unit rows' backward 5:
    17 and 11 for the same work before, and autograd's 14."""
    regulariser = ops_tool.build_regulariser(ops_tool.RECIPE)
    ops = ops_tool.count_ops(regulariser, ops_tool.features(64, 48))

    def from_file(sources, name):
        return sum(count for where, count in sources.items()
                   if where.startswith(name + ':'))

    assert from_file(ops['forward_sources'], 'gram_logdet.py') == 10
    assert from_file(ops['backward_sources'], 'gram_logdet.py') == 7
    assert from_file(ops['backward_sources'], 'coding_rate.py') <= 6
    assert ops['forward_ops']['aten.linalg_cholesky_ex.default'] == 1
    assert 'aten.eye.default' not in ops['forward_ops']
    assert ops['backward_ops']['aten.linalg_solve_triangular.default'] == 2
    assert ops['skip_code'] == 0


def test_tool_reports_counts_and_cpu_time(ops_tool, tmp_path, capsys):
    out = tmp_path / 'ops.json'
    result = ops_tool.main(
        ['--rows', '32', '--dim', '16', '--reps', '2', '--json',
         str(out)])
    assert result['ops']['total'] == \
        result['ops']['forward'] + result['ops']['backward'] > 0
    assert result['cpu_ms']['median'] > 0 and out.exists()
    assert 'aten ops' in capsys.readouterr().out
    assert np.isfinite(result['cpu_ms']['max'])
