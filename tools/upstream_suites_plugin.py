"""pytest plugin: import mmae_plugin before the upstream suites collect.

Loaded by ``tools/upstream_suites.py`` with ``-p upstream_suites_plugin`` so
that every upstream test runs with the plugin's patches applied, as in a
training process whose config has ``custom_imports=['mmae_plugin']``.
"""
import mmae_plugin  # noqa: F401
