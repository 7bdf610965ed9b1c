"""Command line: ``gdnconv simulate`` (the main job) and ``gdnconv bench``."""
import argparse
import sys


def main(argv=None):
    from . import bench, simulate

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
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
