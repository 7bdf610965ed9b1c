"""Command line: ``gdnconv simulate`` (the main job), ``gdnconv bench`` and ``gdnconv generate``."""
import argparse
import sys


def main(argv=None):
    from . import bench, generate, simulate

    parser = argparse.ArgumentParser(prog="gdnconv", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="speculative-decoding simulator, verified against a reference",
                         description=simulate.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    simulate.add_arguments(sim)
    sim.set_defaults(run=simulate.run)
    ben = sub.add_parser("bench", help="benchmark against a plain copy, the torch loop and every ISA",
                         description=bench.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bench.add_arguments(ben)
    ben.set_defaults(run=bench.run)
    gen = sub.add_parser("generate", help="a random-weight transformers model decoding with and without gdnconv",
                         description=generate.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    generate.add_arguments(gen)
    gen.set_defaults(run=generate.run)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
