"""Set up, inspect and tear down storage profiles by hand (root only).

    python -m bench.profiles setup hdd [--size-gb 4]   # prints where to put data
    python -m bench.profiles start hdd                 # after copying data in
    python -m bench.profiles cold hdd                  # empty the caches
    python -m bench.profiles status
    python -m bench.profiles teardown hdd              # or: teardown all

Run a reader inside the throttle with ``cgexec``-like placement::

    echo $$ > "$(python -m bench.profiles cgroup hdd)/cgroup.procs"

The benchmark harness does all of this itself; this is for poking at a
profile. State lives in ``WORKDIR/profiles/NAME/state.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bench.profiles import PROFILES, Profile, ProfileError

DEFAULT_WORKDIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "work")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("setup", "start", "cold", "cgroup", "status", "teardown"))
    parser.add_argument("name", nargs="?", help=f"one of {', '.join(PROFILES)} (teardown/status: or 'all')")
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR)
    parser.add_argument("--size-gb", type=float, default=4.0, help="loop image size (hdd, ssd)")
    args = parser.parse_args(argv)
    names = list(PROFILES) if args.name in (None, "all") else [args.name]
    if args.action not in ("status", "teardown") and args.name in (None, "all"):
        parser.error(f"{args.action} needs one profile name")
    for name in names:
        if name not in PROFILES:
            parser.error(f"unknown profile {name!r}; known: {', '.join(PROFILES)}")
    try:
        for name in names:
            profile = Profile(PROFILES[name], args.workdir, image_bytes=int(args.size_gb * (1 << 30)))
            if args.action == "setup":
                profile.setup()
                where = profile.backing if profile.spec.kind == "seekfs" else profile.mount
                print(f"{name}: copy data into {where}, then run `python -m bench.profiles start {name}`; "
                      f"read it under {profile.mount}")
            elif args.action == "start":
                profile.load_state()
                profile.start()
                print(f"{name}: ready at {profile.mount}")
            elif args.action == "cold":
                profile.load_state()
                profile.cold()
            elif args.action == "cgroup":
                print(profile.load_state().get("cgroup", ""))
            elif args.action == "status":
                state = profile.load_state()
                print(f"{name}: {json.dumps(state) if state else 'not set up'}")
            else:
                profile.teardown()
                print(f"{name}: torn down")
    except ProfileError as exc:
        print(f"bench.profiles: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
