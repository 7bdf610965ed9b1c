"""Command line: ``gdnconv simulate``, the speculative-decoding simulator (the main job).
The benchmarks live outside the package, in the repository's ``benchmarks/`` folder."""
import argparse
import sys


def main(argv=None):
    from . import __version__, simulate

    parser = argparse.ArgumentParser(prog="gdnconv", description=__doc__)
    parser.add_argument("--version", action="version", version=f"gdnconv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="speculative-decoding simulator, verified against a reference",
                         description=simulate.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    simulate.add_arguments(sim)
    sim.set_defaults(run=simulate.run)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
