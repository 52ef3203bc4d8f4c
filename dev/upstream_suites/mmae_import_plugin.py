"""pytest plugin: import the plugin before the upstream suites collect.

Loaded by ``dev/upstream_suites/upstream_suites.py`` with
``-p mmae_import_plugin`` so that every upstream test runs in a process
where everything ``custom_imports=['mmae_plugin.registration']`` does in a
training process has happened: every component registered, and the
plugin's process-wide (security) workarounds applied. ``import
mmae_plugin`` alone registers nothing, in any import order (see
``mmae_plugin/__init__.py``).
"""
import mmae_plugin.registration  # noqa: F401
