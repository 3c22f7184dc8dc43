"""``fusionc cache info`` / ``fusionc cache clear``: the cubin cache's folder, size and limit;
remove its entries (:mod:`fusionc.runtime.cache_evict`)."""
from __future__ import annotations

import argparse

from fusionc.cli import command

_EPILOG = """\
The folder is $FUSIONC_CACHE_DIR, else the user cache folder ($XDG_CACHE_HOME/fusionc, by
default ~/.cache/fusionc on Linux); least recently used cubins are evicted beyond
$FUSIONC_CACHE_MAX_MB megabytes (default 2048; 0: no limit). The autotuning choices
(autotune.json) stay unless clear is given --autotune.

examples:
  fusionc cache info
  fusionc cache clear
  FUSIONC_CACHE_DIR=.fcache fusionc cache info
"""


@command("cache", "show (info) or empty (clear) the cubin cache")
def setup(p):
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = _EPILOG
    p.add_argument("action", choices=("info", "clear"))
    p.add_argument("--autotune", action="store_true",
                   help="clear: also remove the autotuning choices (autotune.json)")
    return run


def run(args) -> int:
    """Run ``fusionc cache`` (see its help)."""
    from fusionc.runtime import cache_evict
    from fusionc.runtime.cache import cache_dir
    d = cache_dir()
    if d is None:
        print("the cubin cache is off (FUSIONC_CACHE_DIR)")
        return 0
    tune = d / "autotune.json"
    if args.action == "clear":
        n = cache_evict.clear(d)
        if args.autotune:
            tune.unlink(missing_ok=True)
        print(f"removed {n} cached cubin(s) from {d}/"
              + (", and the autotuning choices" if args.autotune else ""))
        return 0
    es = cache_evict.entries(d)
    limit = cache_evict.max_bytes()
    print(f"folder: {d}/\n"
          f"entries: {len(es)} cubin(s), {_mb(sum(e.size for e in es))}\n"
          f"limit: {'none' if limit is None else _mb(limit)} (FUSIONC_CACHE_MAX_MB), least "
          "recently used evicted first\n"
          f"autotuning choices: {tune if tune.exists() else 'none'}")
    return 0


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"
