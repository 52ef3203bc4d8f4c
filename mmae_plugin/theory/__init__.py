"""Feature-imbalance theory lab and attention statistics (pure PyTorch).

See ``docs/theory.md``. Nothing in this package imports mmengine or
mmpretrain, so it runs anywhere PyTorch runs.
"""
from .attention_stats import (attention_entropy, mean_attention_distance,
                              patch_grid_distances,
                              query_key_normalized_mutual_information)
from .data import (GLOBAL_AREA, FeatureImbalanceData, ImbalanceSetting,
                   area_index, orthonormal_features)
from .metrics import (area_attention_mass, attention_correlations, evaluate,
                      feature_coefficients, own_area_attention,
                      own_area_attention_ceiling)
from .model import OneLayerAttention
from .objectives import (POOLINGS, SIMILARITIES, infonce_loss, mae_loss,
                         random_visible_mask, view_representation)
from .training import (CL_VIEWS, OBJECTIVES, TrainSetting,
                       gradient_descent_step, objective_value, train)

__all__ = [
    'GLOBAL_AREA', 'FeatureImbalanceData', 'ImbalanceSetting', 'area_index',
    'orthonormal_features', 'OneLayerAttention', 'random_visible_mask',
    'mae_loss', 'infonce_loss', 'view_representation', 'area_attention_mass',
    'own_area_attention', 'own_area_attention_ceiling', 'feature_coefficients',
    'evaluate', 'attention_correlations', 'OBJECTIVES', 'CL_VIEWS', 'POOLINGS',
    'SIMILARITIES', 'TrainSetting', 'gradient_descent_step', 'objective_value',
    'train', 'attention_entropy', 'mean_attention_distance',
    'patch_grid_distances', 'query_key_normalized_mutual_information'
]
