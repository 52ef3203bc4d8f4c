"""Two harmless upstream warnings the plugin's command-line tools do not print.

Without this, every run of ``tools/train.py`` / ``tools/test.py`` started
with them (``docs/upstream_workarounds.md``, "Warnings"):

* mmcv-lite's ``Fail to import ``MultiScaleDeformableAttention`` from
  ``mmcv.ops.multi_scale_deform_attn``, You should install ``mmcv`` rather
  than ``mmcv-lite`` if you need this module.`` (a ``UserWarning`` of
  ``mmcv.cnn.bricks.transformer``). ``import mmpretrain.models`` imports that
  module (mmpretrain's BEiT backbone does), which tries mmcv's compiled ops;
  mmcv-lite has none. Only Deformable-DETR-style detectors (mmdet) use that
  attention: no mmpretrain 1.2 module and none of the plugin's does, and the
  plugin cannot avoid ``mmpretrain.models`` (its models subclass
  mmpretrain's). With full mmcv the import succeeds and mmcv warns nothing
  visible.
* setuptools' ``pkg_resources is deprecated as an API ...`` (a
  ``UserWarning`` from setuptools 80.9 on), raised when mmengine 0.10.7
  resolves the configs' ``mmpretrain::`` bases: its ``is_installed`` imports
  ``pkg_resources`` (attributed to ``mmengine.utils.package_utils``) and
  reloads it (attributed to ``importlib``), see
  :mod:`~mmae_plugin.compat.pkg_resources_check`.

:func:`quiet_known_upstream_warnings` ignores exactly these two, each by its
text, category and the module it is attributed to, within its block. The
plugin's tools enter it before importing anything of mmpretrain; importing
the plugin does not, so in a user's own process these warnings stay as
upstream shows them. Every other warning, of the user's configs, of
mmengine or torch, is shown as before.
"""
import contextlib
import re
import warnings
from typing import Iterator

from .pkg_resources_check import quiet_pkg_resources_deprecation

#: mmcv-lite's text, as mmcv 2.1 / 2.2 word it.
MSDA_TEXT = ('Fail to import ``MultiScaleDeformableAttention`` from '
             '``mmcv.ops.multi_scale_deform_attn``, You should install '
             '``mmcv`` rather than ``mmcv-lite`` if you need this module.')

#: The module mmcv-lite's warning is attributed to.
MSDA_MODULE = r'mmcv\.cnn\.bricks\.transformer\Z'


@contextlib.contextmanager
def quiet_known_upstream_warnings() -> Iterator[None]:
    """Within the block, ignore mmcv-lite's ``MultiScaleDeformableAttention``
    warning and setuptools' ``pkg_resources`` warning raised by mmengine.

    Yields:
        None.
    """
    with quiet_pkg_resources_deprecation():
        warnings.filterwarnings(
            'ignore',
            message=re.escape(MSDA_TEXT),
            category=UserWarning,
            module=MSDA_MODULE)
        yield
