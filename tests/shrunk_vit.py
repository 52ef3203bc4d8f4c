"""``configs/mmae_vit-base_200e.py`` shrunk to ViT-tiny at 32 x 32 (4
patches) with one decoder layer: the model of the CUDA tests
(``test_cuda.py``), of ``dev/benchmarks/bench_compile.py --vit-base`` and of
``dev/gpu_check.sh``'s training stages, which read it as ``--cfg-options``
text (``python tests/shrunk_vit.py``). No imports: any Python prints it.
"""
SHRINK = {
    'model.backbone.arch': 'deit-tiny',
    'model.backbone.img_size': 32,
    'model.neck.num_patches': 4,
    'model.neck.embed_dim': 192,
    'model.neck.decoder_embed_dim': 32,
    'model.neck.decoder_depth': 1,
    'model.neck.decoder_num_heads': 2,
}


def cfg_options_text() -> str:
    """:data:`SHRINK` as ``--cfg-options`` arguments (``key=value ...``)."""
    return ' '.join(f'{key}={value}' for key, value in SHRINK.items())


if __name__ == '__main__':
    print(cfg_options_text())
