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
plugin's allow-list (:func:`mmae_plugin.compat.apply_all`, what
``import mmae_plugin.registration`` applies first), so checkpoints
that mmengine's Runner wrote (message hub with ``HistoryBuffer`` and numpy
arrays, under numpy 1.x or 2.x) load, and a crafted checkpoint that would
run code is refused without running it.

Malformed input is refused with a named error saying what was found and
what is expected (:class:`MalformedCheckpointError`): a checkpoint that is
not a dict, a state dict with non-string keys or non-tensor values, and two
source keys that become one after stripping a wrapper prefix (``module.x``
beside ``x``) or renaming; nothing is dropped silently. ``DST`` naming the
same file as ``SRC`` is refused before anything is read or written. The
command answers each with one line on stderr (exit status 2 for
``SRC == DST``, 1 otherwise).

The output is written atomically: to a temporary beside ``DST``, fsynced,
then renamed over it, so a killed conversion leaves the previous ``DST``
(or none), never a truncated one.

Usage:
    python tools/model_converters/mae_to_mmpretrain.py SRC.pth DST.pth
"""
import argparse
import contextlib
import os.path as osp
import pickle
import re
import sys
from collections import OrderedDict
from typing import Any, Dict, Iterator, List, Mapping, Tuple

import torch

from mmae_plugin.checkpoint.atomic_write import (atomic_write_target,
                                                 open_atomically)
from mmae_plugin.checkpoint.integrity import remove_sidecars
from mmae_plugin.compat import apply_all

# The exact classes mmengine checkpoints pickle, allow-listed for
# weights_only (mmae_plugin.compat.checkpoint_allowlist). Only the security
# fixes, not the registration: converting needs no mmpretrain model, and
# leaving mmpretrain unimported halves the tool's start-up.
apply_all()

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
BLOCK_PREFIXES = {
    'blocks': 'backbone.layers',
    'decoder_blocks': 'neck.decoder_blocks'
}
# Wrapper prefixes that training scripts add (DDP, model EMA, torch.compile).
STRIPPED_PREFIXES = ('module.', '_orig_mod.')
# Fields that hold the weights: FAIR MAE's `model`, mmengine's
# `state_dict`, DeepSpeed's `module`.
WEIGHT_FIELDS = ('model', 'state_dict', 'module')
EXPECTED = ('a dict of str keys to tensors, or a dict holding one under '
            "'model' (FAIR MAE), 'state_dict' (mmengine) or 'module'")


class MalformedCheckpointError(ValueError):
    """The source is not a checkpoint this converter understands."""


class KeyCollisionError(MalformedCheckpointError):
    """Two source keys would become one converted key."""


class SameFileError(ValueError):
    """``dst`` is ``src``: converting would overwrite the source."""


def describe(value: Any) -> str:
    """A short description of a loaded object, for error messages.

    Args:
        value: Anything ``torch.load`` returned.

    Returns:
        Its type, and its length where it has one.
    """
    kind = type(value).__name__
    try:
        return f'a {kind} of {len(value)} items'
    except TypeError:
        return f'a {kind}'


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


def strip_wrappers(key: str) -> str:
    """``key`` without the prefixes DDP, EMA or ``torch.compile`` add.

    Wrappers nest in either order (``_orig_mod.module.`` for a compiled DDP
    model), so prefixes are stripped until none is left.
    """
    stripped = True
    while stripped:
        stripped = False
        for prefix in STRIPPED_PREFIXES:
            if key.startswith(prefix):
                key, stripped = key[len(prefix):], True
    return key


def convert_state_dict(
    state_dict: Mapping[str,
                        torch.Tensor]) -> 'OrderedDict[str, torch.Tensor]':
    """Rename every key of a FAIR MAE / timm ViT state dict.

    Args:
        state_dict: The source weights (encoder, and decoder if present),
            as :func:`check_state_dict` accepts them.

    Returns:
        The same tensors under mmpretrain's keys.

    Raises:
        MalformedCheckpointError: A key is not a string or a value not a
            tensor.
        KeyCollisionError: Two source keys map to one converted key (for
            instance ``module.norm.weight`` and ``norm.weight``), naming
            both; keeping either would silently lose the other.
        KeyError: A key has no mmpretrain counterpart (:func:`rename_key`).
    """
    check_state_dict(state_dict, 'state dict')
    converted = OrderedDict()
    source_of: Dict[str, str] = {}
    for key, value in state_dict.items():
        new_key = rename_key(strip_wrappers(key))
        if new_key in source_of:
            raise KeyCollisionError(
                f'keys {source_of[new_key]!r} and {key!r} both become '
                f'{new_key!r} (after stripping {"/".join(STRIPPED_PREFIXES)} '
                'and renaming); the checkpoint holds two copies of one '
                'weight. Keep one of them (e.g. the EMA or the raw model) '
                'and convert again')
        source_of[new_key] = key
        converted[new_key] = value
    return converted


def check_state_dict(state_dict: Any, where: str) -> None:
    """Refuse a state dict that is not str keys to tensors.

    Args:
        state_dict: The candidate.
        where: What it is, for the message (``"field 'model'"``).

    Raises:
        MalformedCheckpointError: Naming the first bad key or value.
    """
    if not isinstance(state_dict, Mapping) or not state_dict:
        raise MalformedCheckpointError(
            f'{where} is {describe(state_dict)}; expected {EXPECTED}')
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise MalformedCheckpointError(
                f'{where} has the {type(key).__name__} key {key!r}; expected '
                f'{EXPECTED}')
        if not torch.is_tensor(value):
            raise MalformedCheckpointError(
                f'{where} holds {describe(value)} under {key!r}; expected '
                f'{EXPECTED}')


def extract_state_dict(checkpoint: Any) -> Mapping[str, torch.Tensor]:
    """The weights inside a checkpoint (FAIR's ``model``, or ``state_dict``).

    Args:
        checkpoint: What ``torch.load`` returned.

    Returns:
        The state dict, checked by :func:`check_state_dict`.

    Raises:
        MalformedCheckpointError: The checkpoint is not a dict, holds no
            state dict, or its state dict is malformed (what was found and
            what is expected).
    """
    if not isinstance(checkpoint, Mapping):
        raise MalformedCheckpointError(
            f'the checkpoint is {describe(checkpoint)}; expected {EXPECTED}')
    for field in WEIGHT_FIELDS:
        if field in checkpoint:
            check_state_dict(checkpoint[field], f'field {field!r}')
            return checkpoint[field]
    if checkpoint and all(torch.is_tensor(v) for v in checkpoint.values()):
        check_state_dict(checkpoint, 'the checkpoint')
        return checkpoint
    fields = [key for key in checkpoint][:20]
    raise MalformedCheckpointError(
        f'checkpoint fields {fields!r} hold no state dict; expected '
        f'{EXPECTED}')


def load_checkpoint(path: str) -> Any:
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
        MalformedCheckpointError: The file is not a torch checkpoint
            (truncated, or another format).
    """
    with namespace_allowed():
        try:
            return torch.load(path, map_location='cpu', weights_only=True)
        except pickle.UnpicklingError as error:
            raise pickle.UnpicklingError(
                f'src={path!r} was refused under weights_only (it holds '
                f'something outside the allow-list; nothing in it ran): '
                f'{error}') from error
        except (RuntimeError, EOFError) as error:
            # torch's zip reader raises RuntimeError on a truncated or
            # foreign file; EOFError is an empty one.
            raise MalformedCheckpointError(
                f'src={path!r} is not a readable torch checkpoint '
                f'({type(error).__name__}: {error})') from error


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


def same_file(src: str, dst: str) -> bool:
    """Whether writing ``dst`` would overwrite ``src``.

    Args:
        src: The source path.
        dst: The destination path.

    Returns:
        True for one real path (symlinks followed) or one inode (hard
        links).
    """
    if osp.realpath(src) == osp.realpath(dst):
        return True
    try:
        return osp.samefile(src, dst)
    except OSError:  # dst (or src) does not exist yet
        return False


def convert_file(src: str, dst: str) -> List[str]:
    """Convert ``src`` and save ``{'state_dict': ...}`` to ``dst``.

    Returns:
        The converted keys.

    Raises:
        SameFileError: ``dst`` is ``src`` (checked before anything is read
            or written).
        MalformedCheckpointError: See :func:`extract_state_dict` and
            :func:`convert_state_dict`.
    """
    if same_file(src, dst):
        raise SameFileError(
            f'dst={dst!r} is the source checkpoint src={src!r}; converting '
            'would overwrite it. Give another output path')
    dst_dir = osp.dirname(osp.abspath(dst))
    if not osp.isdir(dst_dir):
        raise FileNotFoundError(
            f'dst={dst!r}: folder {dst_dir} does not exist')
    state_dict = convert_state_dict(extract_state_dict(load_checkpoint(src)))
    save_atomically(
        {
            'state_dict': state_dict,
            'meta': {
                'converted_from': osp.basename(src)
            }
        }, dst)
    return list(state_dict)


def save_atomically(checkpoint: Dict[str, Any], dst: str) -> None:
    """``torch.save`` to ``dst`` so a kill leaves the old file or the new.

    The checkpoint is written to a temporary beside ``dst``, fsynced and
    renamed over it (:func:`~mmae_plugin.checkpoint.atomic_write.
    open_atomically`); checksum sidecars of a replaced ``dst`` go first, as
    they would describe other bytes. Where a rename is not what an in-place
    write would do (``dst`` a hard link, a special file or another user's
    file: :func:`~mmae_plugin.checkpoint.atomic_write.atomic_write_target`
    is None) it is written in place, as ``torch.save`` does.

    Args:
        checkpoint: What to save.
        dst: The output path (a symlink is followed).
    """
    target = atomic_write_target(dst)
    for path in {osp.abspath(dst), target or osp.realpath(dst)}:
        remove_sidecars(path)
    if target is None:
        torch.save(checkpoint, dst)
        return
    with open_atomically(target) as file:
        torch.save(checkpoint, file)


def main() -> int:
    """Run the command; the exit status."""
    parser = argparse.ArgumentParser(
        description='Convert a FAIR MAE / timm ViT checkpoint to mmpretrain')
    parser.add_argument('src', help='FAIR MAE or timm checkpoint (.pth)')
    parser.add_argument('dst', help='output checkpoint in mmpretrain layout')
    args = parser.parse_args()
    try:
        keys = convert_file(args.src, args.dst)
    except SameFileError as error:
        print(f'{parser.prog}: error: {error}', file=sys.stderr)
        return 2
    except (MalformedCheckpointError, KeyError, pickle.UnpicklingError,
            OSError) as error:
        # One line naming the problem; the type says which kind it is.
        message = error.args[0] if isinstance(error, KeyError) else error
        print(
            f'{parser.prog}: error: {type(error).__name__}: {message}',
            file=sys.stderr)
        return 1
    parts = sorted({key.split('.')[0] for key in keys})
    print(f'converted {len(keys)} tensors ({", ".join(parts)}) to {args.dst}')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
