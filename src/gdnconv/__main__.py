"""Command line: ``gdnconv simulate``, the speculative-decoding simulator (the main job),
and ``gdnconv generate``, a random-weight transformers model decoding with and without
gdnconv. The benchmarks live outside the package, in the repository's ``benchmarks/``."""
import argparse
import sys


def _plain(doc):
    """A module docstring as --help text: reST's ``literal`` marks dropped."""
    return doc.replace("``", "")


def main(argv=None):
    """Parse ``argv`` (default: sys.argv[1:]) and run the command; returns its exit status.
    Without a command it prints the help and returns 0."""
    from . import __version__, generate, simulate

    parser = argparse.ArgumentParser(prog="gdnconv", description=_plain(__doc__))
    parser.add_argument("--version", action="version", version=f"gdnconv {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands")
    for name, module, about in (
            ("simulate", simulate, "speculative-decoding simulator, verified against a reference"),
            ("generate", generate, "a random-weight transformers model decoding with and without gdnconv")):
        cmd = sub.add_parser(name, help=about, description=_plain(module.__doc__),
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(cmd)
        cmd.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
