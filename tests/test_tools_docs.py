"""The documentation: its guides run as written, its pages reachable.

The guide to adding a regulariser (docs/usage.md) runs as written; the
README stays a front door (at most 200 lines, every docs page linked, no
hand copy of the generated results), every relative link and anchor of the
README and docs/ resolves, and every upstream workaround module has its
section in docs/upstream_workarounds.md.
"""
import glob
import os
import os.path as osp
import re

import numpy as np
import torch
from doc_snippets import doc_block, doc_config
from mmengine.config import Config
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample


def test_documented_regularizer_trains_in_mmae(repo_root, tmp_path,
                                               monkeypatch):
    (tmp_path / 'my_regularizers.py').write_text(
        doc_block(repo_root, 'regularizer-module'))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = Config.fromfile(
        doc_config(repo_root, 'regularizer-config', tmp_path))
    model = MODELS.build(cfg.model)
    reg = model.regularizer
    assert type(reg).__name__ == 'SpectralSpreadLoss'
    # The term against float64 numpy: loss_weight * top eigenvalue of the
    # unit rows' second moment.
    z = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    zn = z.double().numpy()
    zn /= np.linalg.norm(zn, axis=1, keepdims=True)
    expected = 0.01 * np.linalg.eigvalsh(zn.T @ zn / 8)[-1]
    assert abs(reg(z).item() - expected) < 1e-6
    # One real MMAE loss: the term is logged under its own name, with a
    # gradient reaching the encoder.
    images = torch.randn(
        4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    losses = model.loss(images, [DataSample() for _ in range(4)])
    assert {'loss_rec', 'loss_spread'} <= set(losses)
    assert torch.isfinite(losses['loss_spread'])
    losses['loss_spread'].backward()
    assert model.backbone.cls_token.grad.abs().sum() > 0


def test_readme_own_config_block_builds_mmae_from_mmpretrains_recipe(
        repo_root, tmp_path):
    """The README's "in your own config" block, as written: mmpretrain's
    shipped MAE recipe becomes M-MAE with the plugin's runner, checkpoint
    hook and matrix-information hook."""
    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.models.algorithms.mmae import MMAE
    path = tmp_path / 'own.py'
    path.write_text(doc_block(repo_root, 'own-config', page='README.md'))
    cfg = Config.fromfile(str(path))
    assert cfg.runner_type == 'MMAERunner'
    assert cfg.default_hooks.checkpoint.type == 'SafeCheckpointHook'
    assert [h['type'] for h in cfg.custom_hooks] == ['MatrixInfoHook']
    model = MODELS.build(cfg.model)
    assert isinstance(model, MMAE)
    assert type(model.regularizer).__name__ == 'TCRLoss'
    # The rest is mmpretrain's MAE recipe, unchanged.
    (tmp_path / 'upstream.py').write_text(
        "_base_ = 'mmpretrain::mae/"
        "mae_vit-base-p16_8xb512-amp-coslr-300e_in1k.py'\n")
    upstream = Config.fromfile(str(tmp_path / 'upstream.py'))
    assert cfg.model.backbone == upstream.model.backbone
    assert cfg.train_dataloader == upstream.train_dataloader
    images = torch.randn(
        2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    losses = model.loss(images, [DataSample() for _ in range(2)])
    assert torch.isfinite(sum(losses.values()))


# ---------------------------------------------------------------------------
# The README as a front door, and links that resolve
# ---------------------------------------------------------------------------
README_MAX_LINES = 200
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
FENCE = re.compile(r'^```.*?^```', re.S | re.M)


def read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


def markdown_pages(repo_root):
    """README.md, docs/*.md and the collection READMEs."""
    return [
        osp.join(repo_root, 'README.md'),
        *sorted(glob.glob(osp.join(repo_root, 'docs', '*.md'))),
        *sorted(glob.glob(osp.join(repo_root, 'configs', '*', 'README.md')))
    ]


def github_anchor(heading):
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path):
    headings = re.findall(r'^#{1,6} (.+)$', FENCE.sub('', read(path)), re.M)
    return {github_anchor(h) for h in headings}


def relative_links(path):
    """(target path, anchor) of every relative link outside code blocks."""
    links = []
    for target in LINK.findall(FENCE.sub('', read(path))):
        if re.match(r'[a-z]+:', target):
            continue  # http(s), mailto
        file_part, _, anchor = target.partition('#')
        resolved = osp.normpath(osp.join(osp.dirname(path), file_part)) \
            if file_part else path
        links.append((resolved, anchor))
    return links


def test_readme_is_a_front_door_linking_every_docs_page(repo_root):
    readme = read(osp.join(repo_root, 'README.md'))
    assert len(readme.splitlines()) <= README_MAX_LINES
    linked = {
        osp.normpath(target)
        for target, _ in relative_links(osp.join(repo_root, 'README.md'))
    }
    pages = glob.glob(osp.join(repo_root, 'docs', '*.md'))
    assert len(pages) >= 10
    unlinked = [
        osp.relpath(p, repo_root) for p in pages
        if osp.normpath(p) not in linked
    ]
    assert not unlinked, f'docs pages the README does not link: {unlinked}'
    # The two commands, the test one exactly as CI runs it.
    ci = read(osp.join(repo_root, '.ci', 'run'))
    assert 'bash tools/run_tests.sh -q' in ci
    assert 'bash tools/run_tests.sh -q' in readme
    assert 'bash tools/quickstart.sh' in readme
    assert 'source .venv/bin/activate' in readme


def test_readme_links_the_generated_results_instead_of_copying_them(repo_root):
    readme = read(osp.join(repo_root, 'README.md'))
    results = read(osp.join(repo_root, 'docs', 'results.md'))
    rows = [
        line for line in results.splitlines() if line.startswith('| ')
        and not line.startswith('| cell') and '---' not in line
    ]
    assert len(rows) > 20
    copied = [row for row in rows if row in readme]
    assert not copied, copied
    # Not even a row's numbers (a reformatted copy): the MAE arm's first
    # mean (its linear probe).
    mae = next(row for row in rows if row.startswith('| MAE |'))
    assert '±' in mae.split(' | ')[1] and mae.split(' | ')[1] not in readme
    assert '(docs/results.md)' in readme


def test_every_relative_link_and_anchor_resolves(repo_root):
    broken = []
    for page in markdown_pages(repo_root):
        for target, anchor in relative_links(page):
            where = f'{osp.relpath(page, repo_root)} -> ' \
                f'{osp.relpath(target, repo_root)}#{anchor}'
            if not osp.exists(target):
                broken.append(where)
            elif anchor and target.endswith('.md') and \
                    anchor not in anchors(target):
                broken.append(where)
    assert not broken, broken


def test_every_compat_module_has_its_section(repo_root):
    compat = osp.join(repo_root, 'mmae_plugin', 'compat')
    # One module per fix; private modules (``_name.py``) are shared helpers.
    modules = sorted(name[:-3] for name in os.listdir(compat)
                     if name.endswith('.py') and not name.startswith('_'))
    assert 'safe_resume_config' in modules and len(modules) >= 5
    page = read(osp.join(repo_root, 'docs', 'upstream_workarounds.md'))
    sections = re.findall(r'^## `(\w+)`', page, re.M)
    assert len(set(sections)) == len(sections), sections
    assert sorted(sections) == modules
    # Each process-wide module's opt-out variable is documented in its
    # section and in reliability.md.
    import importlib
    reliability = read(osp.join(repo_root, 'docs', 'reliability.md'))
    for name in modules:
        module = importlib.import_module(f'mmae_plugin.compat.{name}')
        variable = getattr(module, 'OPT_OUT_VARIABLE', None)
        if variable is None:
            continue
        section = page.split(f'## `{name}`', 1)[1].split('\n## ', 1)[0]
        assert f'{variable}=1' in section, name
        assert f'`{variable}=1`' in reliability, name


def test_zoo_tables_show_the_metafiles_results(repo_root):
    """The zoo tables of docs/evaluation.md and the collection READMEs are
    written by hand from the metafiles: each entry's row shows its top-1."""
    import yaml
    stale = []
    for metafile in glob.glob(
            osp.join(repo_root, 'configs', '*', 'metafile.yml')):
        for model in yaml.safe_load(read(metafile))['Models']:
            if not model.get('Results'):
                continue
            top1 = model['Results'][0]['Metrics']['Top 1 Accuracy']
            collection = {
                'M-MAE': 'mmae',
                'U-MAE': 'umae',
                'MAE': 'mae'
            }[model['In Collection']]
            for page in ('docs/evaluation.md',
                         f'configs/{collection}/README.md'):
                rows = [
                    line
                    for line in read(osp.join(repo_root, page)).splitlines()
                    if line.startswith(f"| `{model['Name']}`")
                ]
                cells = [
                    cell.split()[0] for row in rows
                    for cell in row.split('|')[1:] if cell.strip()
                ]
                numbers = {
                    float(c)
                    for c in cells if re.fullmatch(r'\d+(\.\d+)?', c)
                }
                if len(rows) != 1 or top1 not in numbers:
                    stale.append(f"{page}: {model['Name']} {top1}")
    assert not stale, stale
