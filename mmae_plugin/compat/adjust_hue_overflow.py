"""``mmcv.adjust_hue`` shifts hue in float instead of overflowing uint8.

Upstream: mmcv 2.2.0's ``adjust_hue`` adds ``np.uint8(hue_factor * 255)``
to an 8-bit hue channel; under numpy 2 every negative factor raises
``OverflowError``, so ``ColorJitter(hue=...)`` recipes (mmpretrain's
SimCLR, BYOL, Barlow Twins, ``configs/cifar10``) stop in their first batch.

What this changes: ``mmcv.adjust_hue``, ``mmcv.image.adjust_hue`` and
``mmcv.image.photometric.adjust_hue`` become :func:`adjust_hue`: the same
arguments and errors, the documented cyclic hue shift computed in float32
and rounded once (within one grey level of an exact shift). Code that bound
the function before the plugin was imported keeps mmcv's.

Opt-out: ``MMAE_NO_ADJUST_HUE_FIX=1`` (read once, at import) leaves mmcv's
function in place. Why, accuracy, cost and tests:
docs/upstream_workarounds.md#adjust_hue_overflow-hue-jitter-under-numpy-2.
"""
from typing import Callable, Dict, Optional

import numpy as np

from ._opt_out import opted_out

#: ``MMAE_NO_ADJUST_HUE_FIX=1``: this module changes nothing.
OPT_OUT_VARIABLE = 'MMAE_NO_ADJUST_HUE_FIX'
OPTED_OUT = opted_out(
    OPT_OUT_VARIABLE, 'mmcv.adjust_hue raises OverflowError under numpy 2 '
    'for every negative hue factor, and recipes with ColorJitter(hue=...) '
    '(mmpretrain SimCLR, BYOL, Barlow Twins) stop in their first batch')

#: The modules that hold the name ``adjust_hue`` (mmpretrain's ColorJitter
#: calls ``mmcv.adjust_hue``).
MODULES = ('mmcv', 'mmcv.image', 'mmcv.image.photometric')

#: Degrees of a full hue circle in OpenCV's float HSV.
FULL_CIRCLE = 360.0

# mmcv's own function, recorded when the fix is applied.
_UPSTREAM: Dict[str, Callable] = {}


def check_arguments(img: np.ndarray, hue_factor: float,
                    backend: Optional[str]) -> str:
    """Upstream's argument checks, in upstream's order and words.

    Args:
        img: Image to be adjusted.
        hue_factor: Shift of the hue, a fraction of the full circle.
        backend: ``'cv2'``, ``'pillow'`` or None for mmcv's default.

    Returns:
        The backend in use.

    Raises:
        ValueError: For an unknown backend or a factor outside
            ``[-0.5, 0.5]``.
        TypeError: If ``img`` is not a 2-d or 3-d array.
    """
    from mmcv.image import photometric
    if backend is None:
        # Upstream reads the name bound in its module at each call.
        backend = photometric.imread_backend
    if backend not in ['cv2', 'pillow']:
        raise ValueError(f'backend: {backend} is not supported.'
                         f"Supported backends are 'cv2', 'pillow'")
    if not (-0.5 <= hue_factor <= 0.5):
        raise ValueError(f'hue_factor:{hue_factor} is not in [-0.5, 0.5].')
    if not (isinstance(img, np.ndarray) and (img.ndim in {2, 3})):
        raise TypeError('img should be ndarray with dim=[2 or 3].')
    if backend == 'pillow':
        assert img.dtype == np.uint8, 'Pillow backend only support uint8 type'
    return backend


def shift_hue(img: np.ndarray, hue_factor: float) -> np.ndarray:
    """Shift the hue of a uint8 BGR image by a fraction of the circle.

    Args:
        img: ``(H, W, 3)`` uint8 image in BGR order.
        hue_factor: Shift, a fraction of the full circle.

    Returns:
        The shifted uint8 image, rounded to the nearest grey level.
    """
    import cv2

    # Float HSV keeps hue in degrees and V on the input's 0-255 scale, so
    # only the final rounding is lost.
    hsv = cv2.cvtColor(img.astype(np.float32), cv2.COLOR_BGR2HSV)
    # OpenCV's vectorised HSV2BGR does not wrap negative hues: keep [0, 360].
    hsv[..., 0] = np.mod(hsv[..., 0] + hue_factor * FULL_CIRCLE, FULL_CIRCLE)
    bgr = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)
    # Rounds and saturates to uint8; values are in [0, 255] already.
    return cv2.convertScaleAbs(bgr)


def adjust_hue(img: np.ndarray,
               hue_factor: float,
               backend: Optional[str] = None) -> np.ndarray:
    """``mmcv.adjust_hue`` computed in float (drop-in replacement).

    Args:
        img: Image to be adjusted, BGR.
        hue_factor: How much to shift the hue, in ``[-0.5, 0.5]``; ``-0.5``
            and ``0.5`` both give the complementary colours, 0 the image.
        backend: ``'cv2'``, ``'pillow'`` or None (mmcv's default); checked
            as upstream does, the result is the same for both.

    Returns:
        The hue-adjusted image, with ``img``'s dtype (cast to uint8 first,
        as upstream does).
    """
    check_arguments(img, hue_factor, backend)
    shifted = shift_hue(img.astype(np.uint8, copy=False), hue_factor)
    return shifted.astype(img.dtype, copy=False)


adjust_hue._mmae_fixed = True


def upstream_adjust_hue() -> Callable:
    """mmcv's own ``adjust_hue``, whether or not the fix is applied.

    Returns:
        The function defined in ``mmcv.image.photometric``.
    """
    from mmcv.image import photometric
    return _UPSTREAM.get('adjust_hue', photometric.adjust_hue)


def fix_adjust_hue_overflow() -> None:
    """Bind :func:`adjust_hue` where mmcv exports ``adjust_hue``."""
    if OPTED_OUT:
        return
    import importlib
    modules = [importlib.import_module(name) for name in MODULES]
    original = modules[-1].adjust_hue
    if getattr(original, '_mmae_fixed', False):
        return
    _UPSTREAM['adjust_hue'] = original
    for module in modules:
        module.adjust_hue = adjust_hue
