"""Utilities shared by every part of the plugin.

Like :mod:`mmae_plugin.matrix_info` and :mod:`mmae_plugin.theory`, this
package needs neither mmengine nor mmpretrain, and it imports no other
plugin module, so anything may import it without a cycle. Import the
modules themselves, e.g. ``from mmae_plugin.utils.validation import
check_bool``.
"""
