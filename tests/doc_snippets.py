"""Code blocks of the documentation that tests run as written.

A block is marked in a Markdown page with ``<!-- doc-test: NAME -->`` on the
line before its fenced ``python`` block; the README's guides live in
``docs/usage.md``.
"""
import os.path as osp

#: The page holding the marked snippets, relative to the repository root.
USAGE_PAGE = osp.join('docs', 'usage.md')


def doc_block(repo_root: str, name: str, page: str = USAGE_PAGE) -> str:
    """The code block after ``<!-- doc-test: name -->`` in ``page``.

    Args:
        repo_root: The repository root.
        name: The marker's name.
        page: The Markdown page, relative to ``repo_root``.

    Returns:
        The text of the fenced ``python`` block that follows the marker.
    """
    with open(osp.join(repo_root, page), encoding='utf-8') as f:
        text = f.read()
    marker = f'<!-- doc-test: {name} -->'
    assert marker in text, f'{page} has no {marker}'
    after = text.split(marker, 1)[1]
    return after.split('```python\n', 1)[1].split('```', 1)[0]


def doc_config(repo_root: str, name: str, folder) -> str:
    """A documented config snippet saved in ``folder``.

    Its relative ``_base_`` (a Fashion-MNIST config, as the page says to put
    the file next to it) is made absolute.

    Args:
        repo_root: The repository root.
        name: The marker's name in :data:`USAGE_PAGE`.
        folder: A ``pathlib.Path`` to write ``<name>.py`` into.

    Returns:
        The path of the written config.
    """
    base_dir = osp.join(repo_root, 'configs', 'fashion_mnist')
    text = doc_block(repo_root, name).replace("_base_ = ['",
                                              f"_base_ = ['{base_dir}/", 1)
    path = folder / f'{name}.py'
    path.write_text(text)
    return str(path)
