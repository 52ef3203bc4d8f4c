# M-MAE on Fashion-MNIST with OnlineProbeHook: a linear probe and a kNN
# monitor trained on the encoder's detached CLS features while pretraining,
# scored on the 10,000 test images after every epoch
# (online_probe/linear_top1, online_probe/knn_top1; docs/evaluation.md).
# The pretraining is mmae_fmnist.py's, bit for bit: only the pipeline keeps
# the labels the probe trains on (mmae_fmnist.py drops them for speed).
# train_features='eval': the probe trains on the unmasked encoder's
# features (one more no-grad forward per step) instead of the masked
# training pass's, which cost 15 points of online accuracy here.
_base_ = ['mmae_fmnist.py']

train_pipeline = [dict(type='PackInputs', meta_keys=())]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))

heldout_dataloader = dict(
    batch_size=500,
    num_workers=0,
    collate_fn=dict(type='default_collate'),
    dataset=dict(
        type={{_base_.dataset_type}},
        data_root={{_base_.data_root}},
        split='test',
        test_mode=True,
        pipeline=[dict(type='PackInputs', meta_keys=())]))

custom_hooks = [
    dict(type='ReseedHook'),
    dict(type='DivergenceHook'),
    dict(type='GlibcMallocHook'),
    dict(
        type='OnlineProbeHook',
        train_features='eval',
        val_dataloader=heldout_dataloader),
]
