"""Two harmless upstream warnings the plugin's command-line tools do not print.

:func:`quiet_known_upstream_warnings` ignores, within its block, exactly
mmcv-lite's ``Fail to import ``MultiScaleDeformableAttention`` ...`` and
setuptools' ``pkg_resources is deprecated as an API ...`` as mmengine
raises it, each by its text, category and the module it is attributed to.
The plugin's tools enter it before importing mmpretrain; importing the
plugin does not, so elsewhere both stay as upstream shows them. Use::

    with quiet_known_upstream_warnings():
        from mmengine.config import Config
        cfg = Config.fromfile(path)

Why they are harmless, and the other warnings of a run:
docs/upstream_workarounds.md#cli_warnings-warnings.
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
