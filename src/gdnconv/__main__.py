"""Command line: ``gdnconv simulate``, the speculative-decoding simulator (the main job),
and ``gdnconv generate``, a random-weight transformers model decoding with and without
gdnconv. The benchmarks live outside the package, in the repository's ``benchmarks/``."""
import argparse
import sys


def main(argv=None):
    from . import __version__, generate, simulate

    parser = argparse.ArgumentParser(prog="gdnconv", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gdnconv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="speculative-decoding simulator, verified against a reference",
                         description=simulate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    simulate.add_arguments(sim)
    sim.set_defaults(run=simulate.run)
    gen = sub.add_parser("generate", help="a random-weight transformers model decoding with and without gdnconv",
                         description=generate.__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    generate.add_arguments(gen)
    gen.set_defaults(run=generate.run)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
