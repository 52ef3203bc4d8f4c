"""Convert a FAIR MAE / timm ViT checkpoint to mmpretrain's layout.

FAIR's MAE release, the U-MAE and M-MAE reference code (both built on it)
and timm's ``VisionTransformer`` share one set of state-dict keys
(``blocks.0.norm1.weight``, ``decoder_blocks.0.mlp.fc1.bias``, ...). This
script renames them to the keys of mmpretrain's ``MAE`` (``backbone.`` for
``MAEViT`` / ``VisionTransformer``, ``neck.`` for ``MAEPretrainDecoder``) and,
for fine-tuned or linear-probe checkpoints, of ``ImageClassifier``
(``head.layers.head``, ``neck.bn``). The output loads with the plugin's
linear, fine-tune and kNN configs through
``model.backbone.init_cfg.checkpoint=OUT.pth`` and into mmpretrain's ``MAE``
through ``load_from``.

The source is read with ``torch.load(weights_only=True)`` through the
plugin's allow-list (``import mmae_plugin``), so checkpoints that mmengine's
Runner wrote (message hub with ``HistoryBuffer`` and numpy arrays, under
numpy 1.x or 2.x) load, and a crafted checkpoint that would run code is
refused without running it.

Usage:
    python tools/model_converters/mae_to_mmpretrain.py SRC.pth DST.pth
"""
import argparse
import contextlib
import os.path as osp
import pickle
import re
from collections import OrderedDict
from typing import Dict, Iterator, List, Tuple

import torch

# The exact classes mmengine checkpoints pickle, allow-listed for
# weights_only (mmae_plugin.compat.checkpoint_allowlist).
import mmae_plugin  # noqa: F401

# (pattern on a source key, replacement) in the order they are tried. Block
# internals are shared by the encoder's `blocks` and the decoder's
# `decoder_blocks`.
BLOCK_RULES: List[Tuple[str, str]] = [
    (r'norm1\.', 'ln1.'),
    (r'norm2\.', 'ln2.'),
    (r'attn\.qkv\.', 'attn.qkv.'),
    (r'attn\.proj\.', 'attn.proj.'),
    (r'mlp\.fc1\.', 'ffn.layers.0.0.'),
    (r'mlp\.fc2\.', 'ffn.layers.1.'),
]
TOP_LEVEL_RULES: List[Tuple[str, str]] = [
    (r'^cls_token$', 'backbone.cls_token'),
    (r'^pos_embed$', 'backbone.pos_embed'),
    (r'^patch_embed\.proj\.', 'backbone.patch_embed.projection.'),
    # `norm` is the encoder's final LayerNorm; fine-tuned checkpoints with
    # global average pooling replace it by `fc_norm` (mmpretrain's ln2).
    (r'^norm\.', 'backbone.ln1.'),
    (r'^fc_norm\.', 'backbone.ln2.'),
    (r'^mask_token$', 'neck.mask_token'),
    (r'^decoder_pos_embed$', 'neck.decoder_pos_embed'),
    (r'^decoder_embed\.', 'neck.decoder_embed.'),
    (r'^decoder_norm\.', 'neck.ln1.'),
    (r'^decoder_pred\.', 'neck.decoder_pred.'),
    # Classifier heads: a Linear (fine-tuning), or FAIR's linear probe
    # BatchNorm1d(affine=False) + Linear.
    (r'^head\.(weight|bias)$', r'head.layers.head.\1'),
    (r'^head\.0\.', 'neck.bn.'),
    (r'^head\.1\.', 'head.layers.head.'),
]
BLOCK_PREFIXES = {'blocks': 'backbone.layers', 'decoder_blocks': 'neck.decoder_blocks'}
# Wrapper prefixes that training scripts add (DDP, model EMA, torch.compile).
STRIPPED_PREFIXES = ('module.', '_orig_mod.')


def rename_key(key: str) -> str:
    """mmpretrain's name for one FAIR MAE / timm ViT key.

    Args:
        key: A source key, e.g. ``'blocks.3.mlp.fc1.weight'``.

    Returns:
        The mmpretrain key, e.g. ``'backbone.layers.3.ffn.layers.0.0.weight'``.

    Raises:
        KeyError: the key has no counterpart in mmpretrain's ViT / MAE (for
            instance timm's layer scale ``ls1.gamma`` or register tokens).
    """
    block = re.match(r'^(blocks|decoder_blocks)\.(\d+)\.(.+)$', key)
    if block:
        group, index, rest = block.groups()
        for pattern, replacement in BLOCK_RULES:
            if re.match(pattern, rest):
                rest = re.sub(pattern, replacement, rest, count=1)
                return f'{BLOCK_PREFIXES[group]}.{index}.{rest}'
    else:
        for pattern, replacement in TOP_LEVEL_RULES:
            if re.search(pattern, key):
                return re.sub(pattern, replacement, key, count=1)
    raise KeyError(
        f'key={key!r} has no counterpart in mmpretrain\'s MAE / ViT: the '
        'converter handles MAE-style ViTs (no layer scale, register tokens '
        'or q/k norm)')


def convert_state_dict(state_dict: Dict[str, torch.Tensor]
                       ) -> 'OrderedDict[str, torch.Tensor]':
    """Rename every key of a FAIR MAE / timm ViT state dict.

    Args:
        state_dict: The source weights (encoder, and decoder if present).

    Returns:
        The same tensors under mmpretrain's keys.
    """
    converted = OrderedDict()
    for key, value in state_dict.items():
        for prefix in STRIPPED_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        converted[rename_key(key)] = value
    return converted


def extract_state_dict(checkpoint: dict) -> Dict[str, torch.Tensor]:
    """The weights inside a checkpoint (FAIR's ``model``, or ``state_dict``)."""
    for field in ('model', 'state_dict', 'module'):
        if isinstance(checkpoint.get(field), dict):
            return checkpoint[field]
    if checkpoint and all(torch.is_tensor(v) for v in checkpoint.values()):
        return checkpoint
    raise ValueError(
        f'checkpoint fields {sorted(checkpoint)}: expected a state dict, or a '
        "dict holding one under 'model' (FAIR MAE) or 'state_dict'")


def load_checkpoint(path: str) -> dict:
    """Load safely: ``weights_only=True`` with the plugin's allow-list.

    FAIR's training script also stores its ``argparse.Namespace`` of
    arguments; that plain attribute container is the one class allowed
    here beyond what every plugin load path allows.

    Args:
        path: The source checkpoint.

    Returns:
        The loaded checkpoint.

    Raises:
        pickle.UnpicklingError: The checkpoint names a class or function
            outside the allow-list (the message names the file and it).
    """
    with namespace_allowed():
        try:
            return torch.load(path, map_location='cpu', weights_only=True)
        except pickle.UnpicklingError as error:
            raise pickle.UnpicklingError(
                f'src={path!r} was refused under weights_only (it holds '
                f'something outside the allow-list; nothing in it ran): '
                f'{error}') from error


@contextlib.contextmanager
def namespace_allowed() -> Iterator[None]:
    """Allow ``argparse.Namespace`` for one load (torch >= 2.5 scopes it).

    torch 2.4 has no ``safe_globals`` context manager; this one-shot CLI
    then adds it to the process's allow-list, which ends with the process.
    """
    if hasattr(torch.serialization, 'safe_globals'):
        with torch.serialization.safe_globals([argparse.Namespace]):
            yield
    else:
        torch.serialization.add_safe_globals([argparse.Namespace])
        yield


def convert_file(src: str, dst: str) -> List[str]:
    """Convert ``src`` and save ``{'state_dict': ...}`` to ``dst``.

    Returns:
        The converted keys.
    """
    state_dict = convert_state_dict(extract_state_dict(load_checkpoint(src)))
    dst_dir = osp.dirname(osp.abspath(dst))
    if not osp.isdir(dst_dir):
        raise FileNotFoundError(f'dst={dst!r}: folder {dst_dir} does not exist')
    torch.save({'state_dict': state_dict,
                'meta': {'converted_from': osp.basename(src)}}, dst)
    return list(state_dict)


def main() -> None:
    parser = argparse.ArgumentParser(
        description='Convert a FAIR MAE / timm ViT checkpoint to mmpretrain')
    parser.add_argument('src', help='FAIR MAE or timm checkpoint (.pth)')
    parser.add_argument('dst', help='output checkpoint in mmpretrain layout')
    args = parser.parse_args()
    keys = convert_file(args.src, args.dst)
    parts = sorted({key.split('.')[0] for key in keys})
    print(f'converted {len(keys)} tensors ({", ".join(parts)}) to {args.dst}')


if __name__ == '__main__':
    main()
