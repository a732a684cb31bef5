"""``python -m convlib.tune``: measure the CPU knobs on this machine and keep them in its profile.

    NUMBA_NUM_THREADS=2 python -m convlib.tune            # quick mode, about two minutes
    python -m convlib.tune --full                          # more candidates, BLIS register tiles
    python -m convlib.tune --show                          # the profile in use
    python -m convlib.tune --forget                        # back to the built-in values
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m convlib.tune", description=__doc__.split("\n")[0].strip("`"))
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--full", action="store_true", help="the full mode: more candidates (longer)")
    what.add_argument("--show", action="store_true", help="print this machine's profile and exit")
    what.add_argument("--forget", action="store_true", help="delete this machine's profile and exit")
    parser.add_argument("--no-save", action="store_true", help="measure and report, write no profile")
    parser.add_argument("--output", metavar="FILE", help="write the profile here instead of this machine's file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    import convlib.tune as tuning

    if args.show:
        print(tuning.show())
        return 0
    if args.forget:
        path = tuning.forget()
        print(f"deleted {path}" if path else "profiles are off (CONVLIB_PROFILE=off)")
        return 0
    result = tuning.tune("full" if args.full else "quick", progress=not args.no_progress,
                         save=not args.no_save, path=args.output)
    print(result.report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
