"""python -m ddstore_bench.gnn COMMAND ...

    generate   compute the atomistic dataset and write its files (see ddstore_bench.gnn.data)
    train      DDP training of the energy network with each loader, and a table of what each cost
"""

import argparse
import sys

from . import data


def _generate(a):
    data.generate(a.out, a.samples, seed=a.seed, cutoff=a.cutoff, fmt=a.format, verbose=True)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m ddstore_bench.gnn", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="compute the dataset and write its files (reused if they exist)",
                       description=data.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--out", required=True, help="directory: DIR/gnn.h5 and DIR/files/sample_NNNNNN.h5")
    g.add_argument("--samples", type=int, default=512, help="number of structures N (default 512)")
    g.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    g.add_argument("--cutoff", type=float, default=3.0, help="edge cutoff in Angstrom (default 3.0)")
    g.add_argument("--format", default="both", help="flat | files | both (default both)")
    g.set_defaults(func=_generate)
    from . import train
    t = sub.add_parser("train", help="DDP training with each loader, and a comparison", description=train.__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_arguments(t)
    t.set_defaults(func=train.run)
    a = p.parse_args(argv)
    try:
        return a.func(a)
    except ValueError as e:
        print(f"{p.prog} {a.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
