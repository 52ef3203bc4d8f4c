# The small ViT shared by every Fashion-MNIST config (MAE, U-MAE, M-MAE,
# contrastive, linear probe): 4 layers, 128 wide, 4 heads, 7 x 7 patches of
# 4 x 4 pixels over 28 x 28 one-channel images.
vit_arch = dict(
    embed_dims=128, num_layers=4, num_heads=4, feedforward_channels=512)
img_size = 28
patch_size = 4
in_channels = 1
num_patches = (img_size // patch_size)**2
