"""``peep bench --out FILE.json [--quick] [--sections ...]``: one JSON with sections core, edge, server (and cluster).

Each section is measured in this run (baselines included), so numbers are
comparable within the file even on a shared, noisy machine. A section whose
package is not installed or whose run fails is recorded with its error
instead of aborting the others. The core section's OpenDP comparison needs
the extra ``peep-lab[bench]``. The cluster section (``peep.lab.bench.cluster``) runs
only when named in ``--sections``: it needs PostgreSQL and an MQTT broker.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

SECTIONS = {
    "core": "peep.lab.bench.core",
    "edge": "peep.edge.bench",
    "server": "peep.lab.bench.server",
    "cluster": "peep.lab.bench.cluster",
    "door": "peep.lab.bench.door",
    "soak": "peep.lab.bench.soak.runner",
    "detectors": "peep.lab.bench.detectors",
}
#: Run without --sections: the cluster section needs PostgreSQL and a broker, and the door section builds two
#: bundles and servers (minutes), so each is asked for by name.
DEFAULT_SECTIONS = ("core", "edge", "server")


def register(sub: Any) -> None:
    p = sub.add_parser("bench", help="benchmarks: core, edge, server (and cluster) sections as one JSON")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--quick", action="store_true", help="fewer iterations (CI smoke run)")
    p.add_argument("--duration", type=float, default=None,
                   help="soak only: seconds the whole system runs under load and faults (default 3600, --quick 300; a "
                        "full run needs room for every fault's hold, settling and quiet minutes, about 2100 s with "
                        "every fault kind, and a shorter one is refused before anything starts); "
                        "its report, series and system folder go next to --out, in <out>-soak/")  # fmt: skip
    p.add_argument(
        "--sections",
        default=",".join(DEFAULT_SECTIONS),
        help=(
            "comma-separated subset of core,edge,server,cluster,door,soak,detectors (default core,edge,server; "
            "detectors renders scenes with ground truth and measures each face detector per face-height bin; "
            "cluster starts three "
            "peep serve replicas and needs PostgreSQL, PEEP_BENCH_PG_DSN, and an MQTT broker, PEEP_BENCH_MQTT; "
            "door times a door's claim to its lock with a dlib-resnet and a Fisherfaces bundle, over gRPC, "
            "over MQTT when a broker answers on 127.0.0.1:1883, and decided on the device (dlib-resnet K 16 and "
            "32), with the device decider's accuracy over every held-out photo claimed with every badge; soak runs "
            "PostgreSQL, the shipped Mosquitto and HAProxy, two replicas and three cameras for --duration under a "
            "seeded schedule of faults and checks the history)"
        ),
    )
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from peep.lab.bench.cluster import ClusterUnavailableError
    from peep.server.errors import UsageError

    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in SECTIONS]
    if unknown:
        raise UsageError(f"--sections: expected a subset of {','.join(SECTIONS)}, received {','.join(unknown)}")
    if args.duration is not None and not (300.0 <= args.duration <= 7 * 86_400.0):
        raise UsageError(f"--duration: expected 300 to 604800 seconds, received {args.duration:g}")
    result: dict[str, Any] = {
        "meta": {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "quick": bool(args.quick),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        }
    }
    failed = False
    for name in wanted:
        print(f"peep bench: {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(SECTIONS[name])
            if name == "soak":
                soak_dir = Path(args.out).with_name(Path(args.out).stem + "-soak")
                section = module.run(quick=args.quick, duration_s=args.duration, out_dir=str(soak_dir))
            else:
                section = module.run(quick=args.quick)
        except (UsageError, ClusterUnavailableError) as exc:  # a missing extra or service: recorded like any failure
            section = {"error": str(exc)}
            failed = True
        except ModuleNotFoundError as exc:
            section = {"error": f"not installed: {exc.name}"}
            failed = True
        except Exception as exc:  # record and continue with the other sections
            section = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(limit=5)}
            failed = True
        if "error" in section:
            print(f"peep bench: {name}: {section['error']}", file=sys.stderr, flush=True)
        section["wall_s"] = round(time.perf_counter() - t0, 2)
        result[name] = section
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=float) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "meta"}, indent=2, default=float))
    return 1 if failed else 0
