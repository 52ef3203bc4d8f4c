"""Peak memory of the kNN evaluation on a CPU, at a stated bank size.

Not a timing benchmark: in a fresh process, builds a float32 bank (N x d,
random), its labels and a chunk of queries, then reads the process's
resident-set high-water mark (``ru_maxrss``) before and after
:func:`~mmae_plugin.evaluation.knn.knn_class_scores`; the difference is
the memory the kNN itself needed beyond its inputs::

    python dev/benchmarks/knn_memory.py --rows 200000 --dim 768
    python dev/benchmarks/knn_memory.py --module OTHER_KNN.py  # compare

``--module`` loads ``knn_class_scores`` from another file (e.g. an older
version of ``mmae_plugin/evaluation/knn.py`` taken with ``git show``).
"""
import argparse
import importlib.util
import json
import resource

import torch

MIB = 2**20


def peak_rss_bytes() -> int:
    """The process's resident-set high-water mark (Linux: KiB units)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_knn_class_scores(path: str):
    """``knn_class_scores`` of the plugin, or of the file ``path``."""
    if not path:
        from mmae_plugin.evaluation.knn import knn_class_scores
        return knn_class_scores
    spec = importlib.util.spec_from_file_location('other_knn', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.knn_class_scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rows', type=int, default=200000)
    parser.add_argument('--dim', type=int, default=768)
    parser.add_argument('--queries', type=int, default=1024)
    parser.add_argument('--k', type=int, default=20)
    parser.add_argument('--module', default='')
    args = parser.parse_args()
    knn_class_scores = load_knn_class_scores(args.module)
    gen = torch.Generator().manual_seed(0)
    bank = torch.randn(args.rows, args.dim, generator=gen)
    labels = torch.randint(0, 1000, (args.rows, ), generator=gen)
    query = torch.randn(args.queries, args.dim, generator=gen)
    # Warm up the allocator and kernels on a tiny bank first.
    knn_class_scores(query[:2], bank[:100], labels[:100], 1000, args.k)
    before = peak_rss_bytes()
    knn_class_scores(query, bank, labels, 1000, args.k)
    extra = peak_rss_bytes() - before
    print(
        json.dumps(
            dict(
                rows=args.rows,
                dim=args.dim,
                queries=args.queries,
                bank_mib=round(bank.numel() * 4 / MIB, 1),
                peak_extra_mib=round(extra / MIB, 1),
                module=args.module or 'mmae_plugin.evaluation.knn')))


if __name__ == '__main__':
    main()
