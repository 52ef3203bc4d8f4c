"""``mmcv.adjust_hue`` shifts hue in float instead of overflowing uint8.

Upstream: mmcv 2.2.0 ``mmcv.image.photometric.adjust_hue`` (the newest mmcv
and mmcv-lite release) converts the image to 8-bit HSV
(``COLOR_BGR2HSV_FULL``: hue 0-255 for the full circle) and adds
``np.uint8(hue_factor * 255)`` to the hue channel, counting on uint8
wrap-around ("uint8 addition take cares of rotation across boundaries").
numpy 2 turns the float into a Python int before the cast and refuses a
negative one: every ``hue_factor`` below ``-1/255`` raises ``OverflowError:
Python integer -46 out of bounds for uint8`` (``np.errstate`` does not
cover it; the pillow backend has the same line). numpy 1 let C cast the
negative float, a conversion C leaves undefined. mmpretrain 1.2.0's
``ColorJitter`` calls ``mmcv.adjust_hue`` with a factor drawn from
``[-hue, hue]``, so with ``hue=0.1`` (mmpretrain's SimCLR, BYOL and Barlow
Twins recipes, this repository's ``configs/cifar10``) about one image in
two raises and training stops in its first batch.

What this changes: ``mmcv.adjust_hue``, ``mmcv.image.adjust_hue`` and
``mmcv.image.photometric.adjust_hue`` (mmpretrain looks up
``mmcv.adjust_hue`` at each call) become :func:`adjust_hue`, which takes the
same arguments, raises the same errors for bad ones and computes the hue
shift mmcv documents (a cyclic shift of the hue by ``hue_factor`` of the
full circle) in float32: OpenCV's float HSV (hue in degrees), the hue moved
by ``hue_factor * 360`` modulo 360, converted back and rounded once. Its
result is within one grey level of an exact float64 hue shift (equal to it
on the tests' 300 random images). Upstream's 8-bit path is not: 8-bit hue
steps are 1/256 of the circle (up to 6 grey levels each on saturated
colours), ``int(hue_factor * 255)`` truncates and takes 255 for the full
circle, and the 8-bit HSV round trip alone moves pixels by up to 9 levels;
with numpy 1's wrap-around it is up to 16 grey levels (mean 0.8) from the
exact shift on 300 random images and factors. So where upstream runs
(positive factors) results differ from it by that much (augmentations are
random draws either way); keeping upstream's arithmetic would have kept
that error. Both backends compute the same result (``backend`` only selects
upstream's checks). Cost: about 3 times upstream's time (1 ms for a
224 x 224 image on one CPU core), applied under numpy 1 too. Code that
bound the function before the plugin was imported (``from mmcv import
adjust_hue``) keeps upstream's.

An environment pin (``numpy<2``) was not chosen: the opencv-python this
environment installs (5.0) requires numpy >= 2 on Python >= 3.9, so the pin
would downgrade OpenCV and the rest of the stack for one line of mmcv, and
leave users of the plugin on numpy 2 with the failure.

Opt-out: ``MMAE_NO_ADJUST_HUE_FIX=1`` (read once, at import) leaves mmcv's
function in place: under numpy 2 every negative hue factor raises
``OverflowError``, so recipes with ``ColorJitter(hue=...)`` stop in their
first batch.
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
