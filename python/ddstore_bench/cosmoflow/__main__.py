"""python -m ddstore_bench.cosmoflow COMMAND ...

    generate   write the synthetic CosmoFlow-like dataset (see ddstore_bench.cosmoflow.data)
    train      the training benchmark: the same DDP training with each loader, SOLAR's report and a comparison
    io         the same reads without a model (SOLAR's I/O evaluation: 4 ranks, batch 16, 3 epochs)
"""

import argparse
import sys

from . import data


def _generate(a):
    data.generate(a.out, a.samples, size=a.size, channels=a.channels, seed=a.seed, fmt=a.format, verbose=True)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddstore_bench.cosmoflow", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="write the synthetic CosmoFlow-like dataset (reused if it exists)",
                       description=data.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--out", required=True, help="directory: DIR/cosmoflow.h5 and DIR/files/sample_NNNNNN.h5")
    g.add_argument("--samples", type=int, default=64, help="number of samples N (default 64)")
    g.add_argument("--size", type=int, default=32, help="cube side S (default 32; 128 for CosmoFlow's size)")
    g.add_argument("--channels", type=int, default=4, help="channels C (default 4)")
    g.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    g.add_argument("--format", default="both", help="chunked | files | both (default both)")
    g.set_defaults(func=_generate)
    from . import train
    for mode, what in (("train", "the training benchmark: DDP training with each loader, SOLAR's report, a comparison"),
                       ("io", "the same reads without a model (SOLAR's I/O evaluation)")):
        t = sub.add_parser(mode, help=what, description=train.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        train.add_arguments(t, mode)
        t.set_defaults(func=lambda a, mode=mode: train.run(a, mode))
    a = p.parse_args(argv)
    try:
        return a.func(a)
    except ValueError as e:
        print(f"{p.prog} {a.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
