# The Fashion-MNIST ViT (../../fashion_mnist/_base_/vit-tiny-p4_arch.py:
# 4 layers, 128 wide, 4 heads) on 2 x 2 mosaics of 56 x 56 pixels, with
# 7 x 7-pixel patches: each 28 x 28 cell is exactly 4 x 4 patches, and the
# 64 tokens cost about what the 49 of a single item do.
vit_arch = dict(
    embed_dims=128, num_layers=4, num_heads=4, feedforward_channels=512)
grid = 2
img_size = 28 * grid
patch_size = 7
in_channels = 1
num_patches = (img_size // patch_size)**2
num_cells = grid**2
