"""mmae-plugin: matrix information theory for MMPretrain self-supervision."""
from setuptools import find_packages, setup

# Exact pins: this stack is what the plugin is tested on (see README for
# using full mmcv on GPU machines instead of mmcv-lite).
INSTALL_REQUIRES = [
    'torch==2.14.1',
    'torchvision==0.29.1',
    'mmengine==0.10.7',
    'mmcv-lite==2.2.0',
    'mmpretrain==1.2.0',
    'timm==1.0.31',
    # mmengine 0.10.7 resolves `mmpretrain::` bases through pkg_resources.
    'setuptools<82',
]
EXTRAS_REQUIRE = {
    # tests read TensorBoard event files written by MatrixInfoHook runs.
    'tests': ['pytest==9.2.0', 'scipy==1.17.1', 'tensorboard==2.21.0'],
    'analysis': ['matplotlib==3.11.2', 'tensorboard==2.21.0'],
}
EXTRAS_REQUIRE['all'] = sorted(
    {req for reqs in EXTRAS_REQUIRE.values() for req in reqs})

setup(
    name='mmae-plugin',
    version='0.1.0',
    description='M-MAE, U-MAE and matrix-information tools for MMPretrain',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    packages=find_packages(include=['mmae_plugin', 'mmae_plugin.*']),
    python_requires='>=3.9',
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    license='Apache-2.0',
)
